"""What every layer uses: the errors a collector raises (:mod:`.errors`) and the argument checks
run before any process starts (:mod:`.checks`). Imports nothing of the library.
"""
