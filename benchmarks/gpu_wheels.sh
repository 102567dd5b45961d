#!/usr/bin/env bash
# Wheels of fedkt's dependencies that the GPU machine lacks (it has torch, transformers,
# peft and accelerate, and no network), for benchmarks/gpu_check.py. Two steps:
#
#   bash benchmarks/gpu_wheels.sh              # here: download into benchmarks/.gpu_wheels/
#   bash benchmarks/gpu_wheels.sh --install    # there: unpack into benchmarks/.gpu_wheels/site
#
# benchmarks/.gpu_wheels/ is git-ignored; carry it with the command (at most 64 MiB in all).
# Only what a local-runtime run imports: pydantic (+ pydantic-core, annotated-types, a
# typing-extensions recent enough for it,
# typing-inspection), rapidfuzz and gguf (matplotlib, datasets, rouge-score and flwr are not imported by the
# tiny configs without plots). Binary wheels (pydantic-core, rapidfuzz) are fetched for each Python in
# PYVERS (default "3.10 3.11 3.12"), manylinux x86_64. WITH_VISION=1 adds scikit-learn and
# scipy (the image configs' digits; about 50 MiB, one Python: the first of PYVERS).
# WITH_BNB=1 adds bitsandbytes (43 MiB, every Python and CUDA version in one wheel) for
# gpu_check's big4 part; beside a tracked tree over 21 MiB it is over the carry limit.
set -euo pipefail
DIR="$(cd "$(dirname "$0")" && pwd)/.gpu_wheels"
if [[ "${1:-}" == "--install" ]]; then
    py="$(python -c 'import sys;print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
    rm -rf "$DIR/site" && mkdir -p "$DIR/site"
    for whl in "$DIR"/*.whl; do
        case "$whl" in *-cp3*-cp3*) [[ "$whl" == *"-$py-"* ]] || continue ;; esac
        python -m zipfile -e "$whl" "$DIR/site" 2>/dev/null \
            || python -c "import zipfile,sys;zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
                "$whl" "$DIR/site"
    done
    echo "unpacked $(ls "$DIR"/*.whl | wc -l) wheels for $py into $DIR/site"
    exit 0
fi
PYVERS="${PYVERS:-3.10 3.11 3.12}"
mkdir -p "$DIR"
pure=(pydantic==2.14.4 annotated-types==0.8.0 typing-inspection==0.4.5 gguf==0.19.0
      typing-extensions==4.16.0)
binary=(pydantic-core==2.50.5 rapidfuzz==3.13.0)
python -m pip download --no-deps --only-binary=:all: -d "$DIR" "${pure[@]}"
for v in $PYVERS; do
    python -m pip download --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --python-version "$v" --implementation cp \
        -d "$DIR" "${binary[@]}"
done
if [[ "${WITH_VISION:-0}" == "1" ]]; then
    v="${PYVERS%% *}"
    python -m pip download --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --python-version "$v" --implementation cp \
        -d "$DIR" scikit-learn==1.9.1 scipy==1.17.1 joblib==1.6.0 threadpoolctl==3.8.0
fi
if [[ "${WITH_BNB:-0}" == "1" ]]; then
    python -m pip download --no-deps --only-binary=:all: --platform manylinux_2_24_x86_64 \
        --python-version "${PYVERS%% *}" -d "$DIR" bitsandbytes==0.50.2
fi
size=$(du -sm "$DIR" | cut -f1)
# What travels is the tracked tree and the carried wheels together (the tree counts 0
# outside a git checkout, where it is not known).
tree=$(cd "$DIR/../.." && { git ls-files -z 2>/dev/null || true; } | du -cm --files0-from=- | tail -1 | cut -f1)
echo "$DIR: $(ls "$DIR"/*.whl | wc -l) wheels, ${size} MiB, with the ${tree} MiB tree $((size + tree)) MiB (carry limit 64 MiB)"
if (( size + tree > 64 )); then
    echo "too big to carry: drop WITH_BNB, WITH_VISION or Python versions" >&2; exit 1
fi
