"""Ray worker roles (installed as roll_lite.workers)."""

from roll_lite.runtime.importing import check_one_tree

check_one_tree(__file__)
