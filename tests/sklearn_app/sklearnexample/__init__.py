"""sklearnexample: A Flower / sklearn app."""
