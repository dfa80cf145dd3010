"""pytorch-example: A Flower / PyTorch app."""

import json
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, Dataset

# The advanced example partitions Fashion-MNIST with flwr-datasets; this copy keeps its functions on scikit-learn's
# bundled digits (offline), with batches of the same dicts (batch["image"], batch["label"]).
NUM_CENTRAL_TEST = 297


class Net(nn.Module):
    """A small CNN for 8x8 digits."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(8 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)  # the classification head, kept on each client

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Rows(Dataset):
    """Rows {"image": 1x8x8 tensor, "label": int}."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        image = torch.tensor(self.images[i], dtype=torch.float32).view(1, 8, 8) / 16.0
        return {"image": image, "label": int(self.labels[i])}


def _digits():
    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(7).permutation(len(labels))
    return images[order], labels[order]


def load_data(partition_id: int, num_partitions: int):
    """Load partition digits data: (trainloader, valloader)."""
    images, labels = _digits()
    images, labels = images[NUM_CENTRAL_TEST:], labels[NUM_CENTRAL_TEST:]
    partition = np.array_split(np.arange(len(labels)), num_partitions)[partition_id]
    split = int(0.8 * len(partition))
    train, val = partition[:split], partition[split:]
    trainloader = DataLoader(Rows(images[train], labels[train]), batch_size=32, shuffle=True)
    valloader = DataLoader(Rows(images[val], labels[val]), batch_size=32)
    return trainloader, valloader


def load_centralized_testloader():
    """The server's test set."""
    images, labels = _digits()
    return DataLoader(Rows(images[:NUM_CENTRAL_TEST], labels[:NUM_CENTRAL_TEST]), batch_size=128)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(batch["image"].to(device)), batch["label"].to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


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


def create_run_dir(config):
    """Create a directory where to save results from this run."""
    run_dir = datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f")
    save_path = Path.cwd() / f"outputs/{run_dir}"
    save_path.mkdir(parents=True, exist_ok=False)
    with open(f"{save_path}/run_config.json", "w", encoding="utf-8") as fp:
        json.dump(dict(config), fp)
    return save_path, run_dir
