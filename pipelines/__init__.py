"""Pipeline controllers (installed as roll_lite.pipelines)."""
