"""A package, so that the corpus can run a script as `python -m compatpkg.identity` too."""
