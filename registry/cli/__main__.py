"""``python -m registry.cli`` == ``pt2reg``."""
from . import main

main()
