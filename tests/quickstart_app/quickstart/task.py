"""quickstart: a Flower / PyTorch app on scikit-learn's digits."""

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    """A small MLP for 8x8 digits."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x):
        return self.layers(x)


def load_data(partition_id: int, num_partitions: int):
    """Load an IID partition of digits: (trainloader, testloader)."""
    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(42).permutation(len(labels))
    part = np.array_split(order, num_partitions)[partition_id]
    x = torch.tensor(images[part] / 16.0, dtype=torch.float32)
    y = torch.tensor(labels[part], dtype=torch.long)
    split = int(0.8 * len(y))
    train = TensorDataset(x[:split], y[:split])
    test = TensorDataset(x[split:], y[split:])
    return DataLoader(train, batch_size=16, shuffle=True), DataLoader(test, batch_size=64)


def label_counts(context):
    """Per-class label counts of this client's training data: the market's input."""
    trainloader, _ = load_data(context.node_config["partition-id"], context.node_config["num-partitions"])
    return np.bincount(trainloader.dataset.tensors[1].numpy(), minlength=10)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for x, y in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for x, y in testloader:
            outputs = net(x.to(device))
            loss += criterion(outputs, y.to(device)).item()
            correct += (torch.max(outputs.data, 1)[1] == y.to(device)).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
