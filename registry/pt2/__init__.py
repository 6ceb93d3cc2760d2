"""Reading `.pt2` files from their bytes alone: no torch, no unpickling, no op registration."""
