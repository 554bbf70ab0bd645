"""Pipeline controllers (installed as roll_lite.pipelines)."""

from roll_lite.runtime.importing import check_one_tree

check_one_tree(__file__)
