pytest_plugins = ["elastic.testing"]
