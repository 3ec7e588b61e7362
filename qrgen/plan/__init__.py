"""The plan: a schedule turned into kernel specs and launches. One module per kernel family owns that family's field
checks, resource model, name, template arguments, launch signature and the target features it needs
(family.py lists them); planner.py puts a schedule's panels and products together, layout.py places them."""
