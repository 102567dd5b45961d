"""Compact image classifiers in plain torch, in the families KOALA uses.

KOALA (Chen et al., arXiv:2407.05268) pairs a large server model (VGG19) with small
client models (MobileNetV2/V3-Small, EfficientNet-B0, ShuffleNetV2 x0.5/x2.0). These
are re-implementations scaled for small images (8x8 digits, 28x28, 32x32): the
stem does not downsample below 64 px, and a stride-2 stage only halves the map
while it is at least 4x4, so no map shrinks below 2x2.

Every model is a :class:`VisionClassifier`:

* ``stem`` then ``blocks`` (an ``nn.ModuleList``; a block is a stage or a unit,
  see each builder) then global average pooling then ``head``;
* ``features(x, upto=h)`` is the feature map after the stem and the first ``h``
  blocks (``h = 0``: the stem alone; ``None``: all blocks), for KOALA's
  hidden-feature loss; ``pooled_features`` averages it to ``[B, feature_dim(h)]``;
* ``head`` is the classifier on the pooled features (the large model's "adapter"
  in KOALA).

torchvision is not needed; :func:`load_torchvision_backbone` and
:func:`load_timm_model` use those libraries when they import, and say so clearly
when they do not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from fedkt.config import ModelConfig
    from fedkt.data.images import DataSpec

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "VISION_MODELS",
    "ExternalClassifier",
    "VisionClassifier",
    "build_model",
    "build_vision_model",
    "count_flops",
    "count_params",
    "efficientnet_b0_small",
    "features_and_logits",
    "head_module",
    "load_timm_model",
    "load_torchvision_backbone",
    "mobilenet_v2_small",
    "mobilenet_v3_small",
    "pool_features",
    "shufflenet_v2_small",
    "vgg_small",
]


# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round channels to a multiple of ``divisor`` without dropping more than 10%."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class _StridePlanner:
    """Grants a requested stride 2 only while the map is at least 4 px on its short side."""

    def __init__(self, image_size: int) -> None:
        if image_size < 1:
            raise ValueError(f"image_size must be >= 1, got {image_size}")
        self.size = image_size

    def __call__(self, requested: int) -> int:
        if requested == 2 and self.size >= 4:
            self.size = math.ceil(self.size / 2)
            return 2
        return 1


def _default_stem_stride(image_size: int) -> int:
    return 2 if image_size > 64 else 1


class ConvBNAct(nn.Sequential):
    """Conv2d (no bias) + BatchNorm2d + optional activation."""

    def __init__(
        self,
        inp: int,
        oup: int,
        kernel: int = 3,
        stride: int = 1,
        groups: int = 1,
        act: Callable[[], nn.Module] | None = nn.ReLU,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(inp, oup, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(oup),
        ]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation: channel gates from globally pooled features."""

    def __init__(
        self,
        channels: int,
        squeeze: int,
        act: Callable[[], nn.Module] = nn.ReLU,
        gate: Callable[[], nn.Module] = nn.Sigmoid,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.act = act()
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.gate = gate()

    def forward(self, x: Tensor) -> Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


class VisionClassifier(nn.Module):
    """Stem, a list of blocks, global average pooling and a classifier ``head``."""

    def __init__(
        self,
        stem: nn.Module,
        blocks: Sequence[nn.Module],
        channels: Sequence[int],
        head: nn.Module,
        num_classes: int,
    ) -> None:
        super().__init__()
        if len(channels) != len(blocks) + 1:
            raise ValueError("channels must list the stem output and every block output")
        self.stem = stem
        self.blocks = nn.ModuleList(blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = head
        self.num_classes = num_classes
        self._channels = list(channels)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def _check_upto(self, upto: int | None) -> int:
        h = self.num_blocks if upto is None else upto
        if not 0 <= h <= self.num_blocks:
            raise ValueError(f"upto must be in [0, {self.num_blocks}] or None, got {upto}")
        return h

    def features(self, x: Tensor, upto: int | None = None) -> Tensor:
        """Feature map ``[B, feature_dim(h), H', W']`` after the stem and ``h`` blocks."""
        h = self._check_upto(upto)
        x = self.stem(x)
        for block in self.blocks[:h]:
            x = block(x)
        return x

    def pooled_features(self, x: Tensor, upto: int | None = None) -> Tensor:
        """``features`` averaged over space: ``[B, feature_dim(h)]``."""
        return torch.flatten(self.pool(self.features(x, upto)), 1)

    def feature_dim(self, h: int | None = None) -> int:
        """Channels of ``features(x, upto=h)``."""
        return self._channels[self._check_upto(h)]

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.pooled_features(x))


# ---------------------------------------------------------------------------
# VGG (the large model)
# ---------------------------------------------------------------------------

_VGG_DEPTHS = {11: (1, 1, 2, 2, 2), 13: (2, 2, 2, 2, 2), 16: (2, 2, 3, 3, 3), 19: (2, 2, 4, 4, 4)}


def vgg_small(
    num_classes: int = 10,
    in_channels: int = 3,
    image_size: int = 32,
    *,
    width: int = 32,
    depth: int = 19,
    dropout: float = 0.0,
    head: str = "linear",
) -> VisionClassifier:
    """VGG-style stacks of 3x3 conv + BN + ReLU (VGG19 layout by default).

    Five stages with ``(1, 2, 4, 8, 8) * width`` channels and ``depth``'s conv counts
    (11/13/16/19); each stage ends in a 2x2 max-pool while the map is >= 4 px.
    Blocks are the five stages; the stem is the identity. ``head``: ``linear`` (one
    Linear layer on the pooled features: KOALA's adapter, "the classifier" appended to
    the backbone) or ``mlp`` (the VGG classifier shape, two hidden linear layers of
    ``2 * last`` units, ``dropout`` between).
    """
    if depth not in _VGG_DEPTHS:
        raise ValueError(f"depth must be one of {sorted(_VGG_DEPTHS)}, got {depth}")
    if head not in ("linear", "mlp"):
        raise ValueError(f"vgg_small head must be 'linear' or 'mlp', got {head!r}")
    plan = _StridePlanner(image_size)
    widths = [width * m for m in (1, 2, 4, 8, 8)]
    blocks: list[nn.Module] = []
    channels = [in_channels]
    c_in = in_channels
    for n_conv, c_out in zip(_VGG_DEPTHS[depth], widths, strict=True):
        layers: list[nn.Module] = []
        for i in range(n_conv):
            layers.append(ConvBNAct(c_in if i == 0 else c_out, c_out, 3))
        if plan(2) == 2:
            layers.append(nn.MaxPool2d(2, ceil_mode=True))
        blocks.append(nn.Sequential(*layers))
        channels.append(c_out)
        c_in = c_out
    if head == "linear":
        return VisionClassifier(nn.Identity(), blocks, channels, nn.Linear(c_in, num_classes),
                                num_classes)
    hidden = 2 * c_in
    mlp = nn.Sequential(
        nn.Linear(c_in, hidden),
        nn.ReLU(inplace=True),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        nn.ReLU(inplace=True),
        nn.Dropout(dropout),
        nn.Linear(hidden, num_classes),
    )
    return VisionClassifier(nn.Identity(), blocks, channels, mlp, num_classes)


# ---------------------------------------------------------------------------
# MobileNetV2
# ---------------------------------------------------------------------------


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise, linear 1x1 project (+ residual)."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: float) -> None:
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNAct(inp, hidden, 1, act=nn.ReLU6))
        layers += [
            ConvBNAct(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
            ConvBNAct(hidden, oup, 1, act=None),
        ]
        self.conv = nn.Sequential(*layers)
        self.use_res = stride == 1 and inp == oup

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


_MBV2_SETTINGS = [  # t, c, n, s
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def mobilenet_v2_small(
    num_classes: int = 10,
    in_channels: int = 3,
    image_size: int = 32,
    *,
    width_mult: float = 0.5,
    stem_stride: int | None = None,
    dropout: float = 0.2,
) -> VisionClassifier:
    """MobileNetV2 (inverted residual blocks) at ``width_mult``.

    Blocks: the seven inverted-residual stages, then the final 1x1 conv
    (``1280 * width_mult`` channels).
    """
    plan = _StridePlanner(image_size)
    s0 = plan(stem_stride or _default_stem_stride(image_size))
    c_in = _make_divisible(32 * width_mult)
    last = _make_divisible(1280 * width_mult)
    stem = ConvBNAct(in_channels, c_in, 3, s0, act=nn.ReLU6)
    blocks: list[nn.Module] = []
    channels = [c_in]
    for t, c, n, s in _MBV2_SETTINGS:
        c_out = _make_divisible(c * width_mult)
        units = []
        for i in range(n):
            units.append(InvertedResidual(c_in, c_out, plan(s) if i == 0 else 1, t))
            c_in = c_out
        blocks.append(nn.Sequential(*units))
        channels.append(c_out)
    blocks.append(ConvBNAct(c_in, last, 1, act=nn.ReLU6))
    channels.append(last)
    head = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, num_classes))
    return VisionClassifier(stem, blocks, channels, head, num_classes)


# ---------------------------------------------------------------------------
# MobileNetV3-Small
# ---------------------------------------------------------------------------


class _V3Block(nn.Module):
    """MobileNetV3 bneck: expand, depthwise, squeeze-excite, project (+ residual)."""

    def __init__(
        self, inp: int, kernel: int, exp: int, oup: int, se: bool, hs: bool, stride: int
    ) -> None:
        super().__init__()
        act: Callable[[], nn.Module] = nn.Hardswish if hs else nn.ReLU
        layers: list[nn.Module] = []
        if exp != inp:
            layers.append(ConvBNAct(inp, exp, 1, act=act))
        layers.append(ConvBNAct(exp, exp, kernel, stride, groups=exp, act=act))
        if se:
            layers.append(SqueezeExcite(exp, _make_divisible(exp // 4), nn.ReLU, nn.Hardsigmoid))
        layers.append(ConvBNAct(exp, oup, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.use_res = stride == 1 and inp == oup

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x) if self.use_res else self.block(x)


_MBV3_SMALL = [  # kernel, expansion, out, SE, hardswish, stride
    (3, 16, 16, True, False, 2),
    (3, 72, 24, False, False, 2),
    (3, 88, 24, False, False, 1),
    (5, 96, 40, True, True, 2),
    (5, 240, 40, True, True, 1),
    (5, 240, 40, True, True, 1),
    (5, 120, 48, True, True, 1),
    (5, 144, 48, True, True, 1),
    (5, 288, 96, True, True, 2),
    (5, 576, 96, True, True, 1),
    (5, 576, 96, True, True, 1),
]


def mobilenet_v3_small(
    num_classes: int = 10,
    in_channels: int = 3,
    image_size: int = 32,
    *,
    width_mult: float = 0.5,
    stem_stride: int | None = None,
    dropout: float = 0.2,
) -> VisionClassifier:
    """MobileNetV3-Small (bnecks with squeeze-excite and hardswish) at ``width_mult``.

    Blocks: the eleven bnecks, then the final 1x1 conv (``576 * width_mult``). Head:
    linear to ``1024 * width_mult``, hardswish, dropout, linear.
    """
    plan = _StridePlanner(image_size)
    s0 = plan(stem_stride or _default_stem_stride(image_size))
    c_in = _make_divisible(16 * width_mult)
    stem = ConvBNAct(in_channels, c_in, 3, s0, act=nn.Hardswish)
    blocks: list[nn.Module] = []
    channels = [c_in]
    for k, exp, out, se, hs, s in _MBV3_SMALL:
        e, o = _make_divisible(exp * width_mult), _make_divisible(out * width_mult)
        blocks.append(_V3Block(c_in, k, e, o, se, hs, plan(s)))
        channels.append(o)
        c_in = o
    last_conv = 6 * c_in
    blocks.append(ConvBNAct(c_in, last_conv, 1, act=nn.Hardswish))
    channels.append(last_conv)
    hidden = _make_divisible(1024 * width_mult)
    head = nn.Sequential(
        nn.Linear(last_conv, hidden),
        nn.Hardswish(),
        nn.Dropout(dropout),
        nn.Linear(hidden, num_classes),
    )
    return VisionClassifier(stem, blocks, channels, head, num_classes)


# ---------------------------------------------------------------------------
# EfficientNet-B0
# ---------------------------------------------------------------------------


class MBConv(nn.Module):
    """EfficientNet MBConv: expand, depthwise, squeeze-excite, project (+ residual), SiLU."""

    def __init__(self, inp: int, oup: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = inp * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(ConvBNAct(inp, hidden, 1, act=nn.SiLU))
        layers += [
            ConvBNAct(hidden, hidden, kernel, stride, groups=hidden, act=nn.SiLU),
            SqueezeExcite(hidden, max(1, inp // 4), nn.SiLU, nn.Sigmoid),
            ConvBNAct(hidden, oup, 1, act=None),
        ]
        self.block = nn.Sequential(*layers)
        self.use_res = stride == 1 and inp == oup

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x) if self.use_res else self.block(x)


_EFFNET_B0 = [  # expand, kernel, stride, out channels, layers
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),
    (6, 5, 2, 192, 4),
    (6, 3, 1, 320, 1),
]


def efficientnet_b0_small(
    num_classes: int = 10,
    in_channels: int = 3,
    image_size: int = 32,
    *,
    width_mult: float = 0.5,
    depth_mult: float = 0.5,
    stem_stride: int | None = None,
    dropout: float = 0.2,
) -> VisionClassifier:
    """EfficientNet-B0 layout (MBConv + SE + SiLU) scaled by ``width_mult``/``depth_mult``.

    Blocks: the seven MBConv stages (``ceil(layers * depth_mult)`` units each), then
    the final 1x1 conv (``1280 * width_mult``).
    """
    plan = _StridePlanner(image_size)
    s0 = plan(stem_stride or _default_stem_stride(image_size))
    c_in = _make_divisible(32 * width_mult)
    stem = ConvBNAct(in_channels, c_in, 3, s0, act=nn.SiLU)
    blocks: list[nn.Module] = []
    channels = [c_in]
    for expand, k, s, c, n in _EFFNET_B0:
        c_out = _make_divisible(c * width_mult)
        units = []
        for i in range(max(1, math.ceil(n * depth_mult))):
            units.append(MBConv(c_in, c_out, k, plan(s) if i == 0 else 1, expand))
            c_in = c_out
        blocks.append(nn.Sequential(*units))
        channels.append(c_out)
    last = _make_divisible(1280 * width_mult)
    blocks.append(ConvBNAct(c_in, last, 1, act=nn.SiLU))
    channels.append(last)
    head = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, num_classes))
    return VisionClassifier(stem, blocks, channels, head, num_classes)


# ---------------------------------------------------------------------------
# ShuffleNetV2
# ---------------------------------------------------------------------------


def channel_shuffle(x: Tensor, groups: int) -> Tensor:
    """Interleave the channels of ``groups`` groups (ShuffleNet)."""
    b, c, h, w = x.shape
    return x.view(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2 unit: channel split (or two branches when downsampling) + shuffle."""

    def __init__(self, inp: int, oup: int, stride: int, downsample: bool) -> None:
        super().__init__()
        if oup % 2:
            raise ValueError(f"ShuffleNetV2 output channels must be even, got {oup}")
        half = oup // 2
        self.downsample = downsample
        if not downsample and inp != oup:
            raise ValueError("a split unit needs inp == oup")
        if downsample:
            self.branch1 = nn.Sequential(
                ConvBNAct(inp, inp, 3, stride, groups=inp, act=None),
                ConvBNAct(inp, half, 1),
            )
        self.branch2 = nn.Sequential(
            ConvBNAct(inp if downsample else half, half, 1),
            ConvBNAct(half, half, 3, stride, groups=half, act=None),
            ConvBNAct(half, half, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.downsample:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        else:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        return channel_shuffle(out, 2)


_SHUFFLE_CHANNELS = {
    0.5: (24, 48, 96, 192, 1024),
    1.0: (24, 116, 232, 464, 1024),
    1.5: (24, 176, 352, 704, 1024),
    2.0: (24, 244, 488, 976, 2048),
}


def shufflenet_v2_small(
    num_classes: int = 10,
    in_channels: int = 3,
    image_size: int = 32,
    *,
    width_mult: float = 0.5,
    stages_repeats: Sequence[int] = (2, 4, 2),
    stem_stride: int | None = None,
) -> VisionClassifier:
    """ShuffleNetV2 x``width_mult`` (0.5, 1.0, 1.5 or 2.0; KOALA uses 0.5 and 2.0).

    The stage widths are the paper's; ``stages_repeats`` defaults to half of
    (4, 8, 4). Large images get the stride-2 stem and max-pool, small ones neither.
    Blocks: stage 2, stage 3, stage 4, the final 1x1 conv.
    """
    if width_mult not in _SHUFFLE_CHANNELS:
        raise ValueError(
            f"shufflenet_v2 width_mult must be one of {sorted(_SHUFFLE_CHANNELS)}, got {width_mult}"
        )
    if len(stages_repeats) != 3 or min(stages_repeats) < 1:
        raise ValueError(f"stages_repeats must be three counts >= 1, got {stages_repeats}")
    chans = _SHUFFLE_CHANNELS[width_mult]
    plan = _StridePlanner(image_size)
    s0 = plan(stem_stride or _default_stem_stride(image_size))
    stem_layers: list[nn.Module] = [ConvBNAct(in_channels, chans[0], 3, s0)]
    if s0 == 2 and plan(2) == 2:
        stem_layers.append(nn.MaxPool2d(3, 2, 1))
    stem = nn.Sequential(*stem_layers)
    blocks: list[nn.Module] = []
    channels = [chans[0]]
    c_in = chans[0]
    for reps, c_out in zip(stages_repeats, chans[1:4], strict=True):
        units = [ShuffleUnit(c_in, c_out, plan(2), downsample=True)]
        units += [ShuffleUnit(c_out, c_out, 1, downsample=False) for _ in range(reps - 1)]
        blocks.append(nn.Sequential(*units))
        channels.append(c_out)
        c_in = c_out
    blocks.append(ConvBNAct(c_in, chans[4], 1))
    channels.append(chans[4])
    head = nn.Linear(chans[4], num_classes)
    return VisionClassifier(stem, blocks, channels, head, num_classes)


# ---------------------------------------------------------------------------
# Registry, loaders, counting
# ---------------------------------------------------------------------------

VISION_MODELS: dict[str, Callable[..., VisionClassifier]] = {
    "vgg_small": vgg_small,
    "mobilenet_v2_small": mobilenet_v2_small,
    "mobilenet_v3_small": mobilenet_v3_small,
    "efficientnet_b0_small": efficientnet_b0_small,
    "shufflenet_v2_small": shufflenet_v2_small,
    "shufflenet_v2_x0_5_small": partial(shufflenet_v2_small, width_mult=0.5),
    "shufflenet_v2_x2_0_small": partial(shufflenet_v2_small, width_mult=2.0),
}


def build_vision_model(
    name: str, num_classes: int, in_channels: int = 3, image_size: int = 32, **kwargs
) -> VisionClassifier:
    """Build a registered plain-torch model by name (see ``VISION_MODELS``)."""
    try:
        builder = VISION_MODELS[name]
    except KeyError:
        raise ValueError(
            f"unknown vision model {name!r}; available: {', '.join(sorted(VISION_MODELS))}"
        ) from None
    return builder(num_classes, in_channels, image_size, **kwargs)


def _last_linear(model: nn.Module, what: str) -> tuple[nn.Module, str]:
    """The module holding ``model``'s last ``nn.Linear`` layer (its classifier) and its name
    there; ``what`` says what it is needed for, in the error."""
    last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = name
    if last is None:
        raise ValueError(f"model has no nn.Linear classifier {what}")
    parent_name, _, attr = last.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), attr


def _replace_last_linear(model: nn.Module, num_classes: int) -> nn.Module:
    parent, attr = _last_linear(model, "to replace")
    old = getattr(parent, attr)
    setattr(parent, attr, nn.Linear(old.in_features, num_classes))
    return model


def load_torchvision_backbone(name: str, num_classes: int, pretrained: bool = False) -> nn.Module:
    """A torchvision model (e.g. ``"vgg19"``, ``"mobilenet_v3_small"``) with ``num_classes``.

    Needs an importable torchvision (and, with ``pretrained``, its weights on disk
    or a network). Raises ``ImportError`` explaining the alternative otherwise.
    """
    try:
        import torchvision  # noqa: PLC0415
    except Exception as exc:  # a broken build can raise more than ImportError
        raise ImportError(
            f"torchvision is not importable here ({type(exc).__name__}: {exc}); "
            f"install a torchvision build matching torch {torch.__version__}, or use the "
            f"plain-torch models: build_vision_model(name, ...) with one of "
            f"{sorted(VISION_MODELS)}"
        ) from exc
    if pretrained:
        model = torchvision.models.get_model(name, weights="DEFAULT")
        return _replace_last_linear(model, num_classes)
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


def load_timm_model(name: str, num_classes: int, pretrained: bool = False) -> nn.Module:
    """A timm model with ``num_classes``; raises ``ImportError`` if timm does not import."""
    try:
        import timm  # noqa: PLC0415
    except Exception as exc:
        raise ImportError(
            f"timm is not importable here ({type(exc).__name__}: {exc}); install timm, or "
            f"use the plain-torch models: build_vision_model(name, ...) with one of "
            f"{sorted(VISION_MODELS)}"
        ) from exc
    return timm.create_model(name, pretrained=pretrained, num_classes=num_classes)


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (optionally only those with ``requires_grad``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def count_flops(model: nn.Module, input_shape: Sequence[int]) -> int:
    """FLOPs of one forward pass, counted by ``torch.utils.flop_counter.FlopCounterMode``.

    ``input_shape`` is ``(C, H, W)`` (batch of 1 assumed) or ``(B, C, H, W)``. The
    counter reports 2 FLOPs per multiply-accumulate of convolutions and matmuls
    and ignores element-wise ops. The model runs once in eval mode under
    ``no_grad``; its train/eval mode is restored.
    """
    from torch.utils.flop_counter import FlopCounterMode  # noqa: PLC0415

    shape = tuple(input_shape)
    if len(shape) == 3:
        shape = (1, *shape)
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None else torch.float32
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.zeros(shape, device=device, dtype=dtype))
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())


# --------------------------------------------------------------------------- from a config

# ImageNet's per-channel input statistics (torchvision's and timm's pretrained weights).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ExternalClassifier(nn.Module):
    """A torchvision/timm model split into a backbone and its last linear layer (the head).

    Offers the :class:`~fedkt.models.vision.VisionClassifier` calls KOALA uses, for the
    whole backbone only: ``features(x)`` ``[B, D]``, ``feature_dim()``, ``head``.
    Grey images are repeated to 3 channels; ``input_size`` resizes inputs first;
    ``normalize`` (on for ImageNet-pretrained weights) then applies ImageNet's mean/std,
    the input statistics those weights were trained on.
    """

    def __init__(self, model: nn.Module, in_channels: int, input_size: int | None = None,
                 normalize: bool = False) -> None:
        super().__init__()
        parent, attr = _last_linear(model, "to use as its head")
        self.head = getattr(parent, attr)
        setattr(parent, attr, nn.Identity())
        self.backbone = model
        self.in_channels = in_channels
        self.input_size = input_size
        self.normalize = normalize
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1),
                             persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1),
                             persistent=False)
        self.num_blocks = 0

    def _prep(self, x: Tensor) -> Tensor:
        if self.in_channels == 1:
            x = x.repeat(1, 3, 1, 1)
        if self.input_size:
            x = F.interpolate(x, size=(self.input_size, self.input_size), mode="bilinear",
                              align_corners=False)
        if self.normalize:
            x = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        return x

    def features(self, x: Tensor, upto: int | None = None) -> Tensor:
        if upto not in (None, 0):
            raise ValueError("external models expose only their whole backbone (upto=None)")
        return torch.flatten(self.backbone(self._prep(x)), 1)

    def pooled_features(self, x: Tensor, upto: int | None = None) -> Tensor:
        return self.features(x, upto)

    def feature_dim(self, h: int | None = None) -> int:
        return int(self.head.in_features)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def build_model(model_cfg: ModelConfig, spec: DataSpec, seed: int) -> nn.Module:
    """The model ``model_cfg`` names, initialised from ``seed``.

    ``name``: a model of :data:`fedkt.models.vision.VISION_MODELS` (``tiny`` holds its
    keyword arguments, e.g. ``{width: 16}``), or ``torchvision:<name>`` /
    ``timm:<name>`` (``tiny``: ``pretrained``, ``input_size``) when installed.
    """
    kwargs = dict(model_cfg.tiny)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lib, _, name = model_cfg.name.partition(":")
        if name and lib in ("torchvision", "timm"):
            pretrained = bool(kwargs.pop("pretrained", False))
            input_size = kwargs.pop("input_size", None)
            if kwargs:
                raise ValueError(f"{model_cfg.name}: unknown options {sorted(kwargs)}")
            loader = load_torchvision_backbone if lib == "torchvision" else load_timm_model
            return ExternalClassifier(loader(name, spec.num_classes, pretrained),
                                      spec.in_channels, input_size, normalize=pretrained)
        return build_vision_model(model_cfg.name, spec.num_classes, spec.in_channels,
                                  spec.image_size, **kwargs)


def head_module(model: nn.Module) -> nn.Module:
    """The classifier head (KOALA's "adapter" of the large model)."""
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        raise ValueError(f"{type(model).__name__} has no 'head' module")
    return head


def pool_features(features: Tensor, size: int = 1) -> Tensor:
    """Average-pool a feature map to ``size`` x ``size`` (``size=1``: vectors ``[B, C]``)."""
    if features.dim() == 2:
        return features
    pooled = F.adaptive_avg_pool2d(features, size)
    return torch.flatten(pooled, 1) if size == 1 else pooled


def features_and_logits(model: nn.Module, x: Tensor, upto: int | None) -> tuple[Tensor, Tensor]:
    """``(model.features(x, upto), model(x))`` in one pass where the model allows it."""
    from fedkt.models.vision import VisionClassifier

    if not isinstance(model, VisionClassifier):
        return model.features(x, upto), model(x)
    h = model.num_blocks if upto is None else upto
    if not 0 <= h <= model.num_blocks:
        raise ValueError(f"upto must be in [0, {model.num_blocks}] or None, got {upto}")
    y = model.stem(x)
    feat = y
    for i, block in enumerate(model.blocks):
        if i == h:
            feat = y
        y = block(y)
    if h == model.num_blocks:
        feat = y
    return feat, model.head(torch.flatten(model.pool(y), 1))
