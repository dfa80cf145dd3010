"""fl_dp_sa: Flower Example using Differential Privacy and Secure Aggregation."""
