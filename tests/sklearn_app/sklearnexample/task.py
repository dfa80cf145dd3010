"""sklearnexample: A Flower / sklearn app."""

import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

# The quickstart partitions iris from the Hugging Face hub; this copy keeps its functions on scikit-learn's bundled
# digits (offline): numpy arrays of features and of labels, as its load_data returns them.
UNIQUE_LABELS = list(range(10))
NUM_FEATURES = 64


def get_model_params(model):
    """Return the parameters of a sklearn LogisticRegression model."""
    if model.fit_intercept:
        return [model.coef_, model.intercept_]
    return [model.coef_]


def set_model_params(model, params):
    """Set the parameters of a sklearn LogisticRegression model."""
    model.coef_ = params[0]
    if model.fit_intercept:
        model.intercept_ = params[1]
    return model


def set_initial_params(model, n_classes, n_features):
    """Set initial parameters as zeros (the model has none until it is fitted)."""
    model.classes_ = np.array(list(range(n_classes)))
    model.coef_ = np.zeros((n_classes, n_features))
    if model.fit_intercept:
        model.intercept_ = np.zeros((n_classes,))


def create_log_reg_and_instantiate_parameters(penalty):
    """A warm-started LogisticRegression with zero parameters."""
    model = LogisticRegression(penalty=penalty, max_iter=1, warm_start=True, solver="saga")
    set_initial_params(model, n_features=NUM_FEATURES, n_classes=len(UNIQUE_LABELS))
    return model


def load_data(partition_id: int, num_partitions: int):
    """Load the data for the given partition: X_train, y_train, X_test, y_test."""
    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(3).permutation(len(y))
    X, y = X[order] / 16.0, y[order]
    partition = np.array_split(np.arange(len(y)), num_partitions)[partition_id]
    X, y = X[partition], y[partition]
    split = int(0.8 * len(X))
    return X[:split], y[:split], X[split:], y[split:]
