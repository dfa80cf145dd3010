"""fl_dp_sa: Flower Example using Differential Privacy and Secure Aggregation."""

from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, Dataset

# The example partitions MNIST with flwr-datasets; this copy keeps its functions on scikit-learn's bundled digits
# (offline), with batches of the same dicts (batch["image"], batch["label"]).


class Net(nn.Module):
    """A small CNN for 8x8 digits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(6 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def get_weights(net):
    return [val.cpu().numpy() for _, val in net.state_dict().items()]


def set_weights(net, parameters):
    params_dict = zip(net.state_dict().keys(), parameters, strict=True)
    state_dict = OrderedDict({k: torch.tensor(v) for k, v in params_dict})
    net.load_state_dict(state_dict, strict=True)


class Rows(Dataset):
    """Rows {"image": 1x8x8 tensor, "label": int}."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        image = torch.tensor(self.images[i], dtype=torch.float32).view(1, 8, 8) / 16.0
        return {"image": image, "label": int(self.labels[i])}


def load_data(partition_id: int, num_partitions: int):
    """Load partition digits data: (trainloader, testloader)."""
    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(5).permutation(len(labels))
    partition = np.array_split(order, num_partitions)[partition_id]
    split = int(0.8 * len(partition))
    train, test = partition[:split], partition[split:]
    trainloader = DataLoader(Rows(images[train], labels[train]), batch_size=32, shuffle=True)
    testloader = DataLoader(Rows(images[test], labels[test]), batch_size=32)
    return trainloader, testloader


def train(net, trainloader, valloader, epochs, device):
    """Train the model on the training set; return the train and validation metrics."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net.train()
    for _ in range(epochs):
        for batch in trainloader:
            optimizer.zero_grad()
            criterion(net(batch["image"].to(device)), batch["label"].to(device)).backward()
            optimizer.step()
    train_loss, train_acc = test(net, trainloader, device)
    val_loss, val_acc = test(net, valloader, device)
    return {"train_loss": train_loss, "train_accuracy": train_acc, "val_loss": val_loss, "val_accuracy": val_acc}


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            labels = batch["label"].to(device)
            outputs = net(batch["image"].to(device))
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
