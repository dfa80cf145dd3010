"""A deviating buyer against the product's ClientApp in a real deployment (a test fixture)."""
