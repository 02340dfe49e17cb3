"""Other projects' fault tolerance, measured beside ours in the same benchmark (bench/hot.py's peer variants)."""
