"""The built-in tiny models' names, without the builder: `splice --help` lists them without importing torch. Each
family declares its own (splice/families.py)."""

from splice.families import FAMILIES

DEFAULT_MODEL = "tiny-idefics3-colors"
TINY_NAMES = tuple(name for family in FAMILIES for name in family.tiny)
