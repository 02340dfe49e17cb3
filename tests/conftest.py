pytest_plugins = ["harness.fixtures"]
