"""Ray worker roles (installed as roll_lite.workers)."""
