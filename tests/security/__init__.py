"""Security scenarios: each reproduces an attack and proves it fails."""
