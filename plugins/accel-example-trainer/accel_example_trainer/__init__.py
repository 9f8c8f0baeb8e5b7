"""An example trainer from its own package: ``accel-train count ...`` teaches a tiny model to count."""
