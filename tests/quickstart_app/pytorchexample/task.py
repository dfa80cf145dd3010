"""pytorchexample: A Flower / PyTorch app."""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, Dataset

# Flower's quickstart partitions CIFAR-10 from the Hugging Face hub with flwr-datasets; this copy keeps its
# structure on scikit-learn's bundled digits (offline): the same functions, and DataLoaders whose batches are
# the same dicts (batch["img"], batch["label"]). 297 digits are the central test set, the rest is split IID.
NUM_CENTRAL_TEST = 297


class Net(nn.Module):
    """Model (a small CNN for 8x8 digits, shaped like the quickstart's)"""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 2 * 2)
        return self.fc2(F.relu(self.fc1(x)))


class DictRows(Dataset):
    """Rows {"img": 1x8x8 tensor, "label": int}, as a Hugging Face dataset with a transform yields them."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = torch.tensor(self.images[i], dtype=torch.float32).view(1, 8, 8)
        return {"img": (img / 16.0 - 0.5) / 0.5, "label": int(self.labels[i])}


def _shuffled_digits():
    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(42).permutation(len(labels))
    return images[order], labels[order]


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """Load partition digits data."""
    images, labels = _shuffled_digits()
    images, labels = images[NUM_CENTRAL_TEST:], labels[NUM_CENTRAL_TEST:]
    partition = np.array_split(np.arange(len(labels)), num_partitions)[partition_id]
    # Divide data on each node: 80% train, 20% test
    split = int(0.8 * len(partition))
    train, test = partition[:split], partition[split:]
    # Construct dataloaders
    trainloader = DataLoader(DictRows(images[train], labels[train]), batch_size=batch_size, shuffle=True)
    testloader = DataLoader(DictRows(images[test], labels[test]), batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset():
    """Load test set and return dataloader."""
    images, labels = _shuffled_digits()
    return DataLoader(DictRows(images[:NUM_CENTRAL_TEST], labels[:NUM_CENTRAL_TEST]), batch_size=128)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    avg_trainloss = running_loss / (epochs * len(trainloader))
    return avg_trainloss


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    loss = loss / len(testloader)
    return loss, accuracy
