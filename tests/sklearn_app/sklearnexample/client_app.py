"""sklearnexample: A Flower / sklearn app."""

import warnings

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from sklearn.metrics import log_loss

from sklearnexample.task import (
    UNIQUE_LABELS,
    create_log_reg_and_instantiate_parameters,
    get_model_params,
    load_data,
    set_model_params,
)

# Flower ClientApp
app = ClientApp()


@app.train()
def train(msg: Message, context: Context):
    """Train the model on local data."""

    # Create LogisticRegression Model and apply the received parameters
    model = create_log_reg_and_instantiate_parameters(context.run_config["penalty"])
    set_model_params(model, msg.content["arrays"].to_numpy_ndarrays())

    # Load the data
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    X_train, y_train, _, _ = load_data(partition_id, num_partitions)

    # Ignore convergence failure due to low local epochs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X_train, y_train)

    train_logloss = log_loss(y_train, model.predict_proba(X_train), labels=UNIQUE_LABELS)
    metrics = {
        "num-examples": len(X_train),
        "train_logloss": train_logloss,
        "train_accuracy": model.score(X_train, y_train),
    }
    content = RecordDict({"arrays": ArrayRecord(get_model_params(model)), "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the model on local data."""

    model = create_log_reg_and_instantiate_parameters(context.run_config["penalty"])
    set_model_params(model, msg.content["arrays"].to_numpy_ndarrays())

    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    _, _, X_test, y_test = load_data(partition_id, num_partitions)

    loss = log_loss(y_test, model.predict_proba(X_test), labels=UNIQUE_LABELS)
    metrics = {"num-examples": len(X_test), "test_logloss": loss, "accuracy": model.score(X_test, y_test)}
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
