"""`python -m training.recipes NAME`: the command line of the named recipes (training.recipe_book), for launch
scripts and for reading what a recipe sets."""
