"""The dashboard's rows, one module each; every row builder takes the row's top ``y`` and returns its
panels (the row header first). ``stack/dashboard.py`` stacks them."""
