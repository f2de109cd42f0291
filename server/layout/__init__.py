"""Trial layout (docs/spec.md, "Trial layout"): arms crossed from the scientific values, quasi-
random or grid points in the unit cube mapped to params, and manual trials checked once."""
