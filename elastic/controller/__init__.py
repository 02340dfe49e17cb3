"""The controller: a pure `reconcile(observed) -> actions`, and a loop that observes and applies them."""
