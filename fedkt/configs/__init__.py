"""The run configs that ship with fedkt (``fedkt configs list``): the YAML files in this
folder, and :mod:`fedkt.configs.catalog`, which finds them by name."""
