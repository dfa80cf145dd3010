"""pytorch-example: A Flower / PyTorch app."""

import json
import os
import time
from logging import INFO

import torch
from flwr.app import ConfigRecord
from flwr.common import log
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import log_strategy_start_info


class CustomFedAvg(FedAvg):
    """FedAvg with a learning-rate schedule, results saved each round and a checkpoint of the best model."""

    def set_save_path_and_run_dir(self, path, run_dir):
        """Set the path where results and model checkpoints will be saved."""
        self.save_path = path
        self.run_dir = run_dir

    def _update_best_acc(self, current_round, accuracy, arrays):
        """Save a checkpoint when the global model is the best so far."""
        if accuracy > self.best_acc_so_far:
            self.best_acc_so_far = accuracy
            log(INFO, "New best global model found: %f", accuracy)
            file_name = f"model_state_acc_{accuracy}_round_{current_round}.pth"
            torch.save(arrays.to_torch_state_dict(), self.save_path / file_name)

    def save_metrics_as_json(self, current_round, result):
        """Append this round's results to results.json."""
        path = f"{self.save_path}/results.json"
        results = []
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fp:
                results = json.load(fp)
        results.append(
            {
                "round": current_round,
                "train_metrics": dict(result.train_metrics_clientapp.get(current_round, {})),
                "evaluate_metrics_clientapp": dict(result.evaluate_metrics_clientapp.get(current_round, {})),
                "evaluate_metrics_serverapp": dict(result.evaluate_metrics_serverapp.get(current_round, {})),
            }
        )
        with open(path, "w", encoding="utf-8") as fp:
            json.dump(results, fp)

    def configure_train(self, server_round, arrays, config, grid):
        """Halve the learning rate from round 2 on, then configure as FedAvg does."""
        if server_round == 2:
            config["lr"] = config["lr"] * 0.5
            log(INFO, "Adjusted learning rate to %f", config["lr"])
        return super().configure_train(server_round, arrays, config, grid)

    def start(
        self,
        grid,
        initial_arrays,
        num_rounds=3,
        timeout=3600,
        train_config=None,
        evaluate_config=None,
        evaluate_fn=None,
    ):
        """Run the rounds as FedAvg does, saving the results and the best model as it goes."""
        self.best_acc_so_far = 0.0
        log(INFO, "Starting %s strategy:", self.__class__.__name__)
        log_strategy_start_info(num_rounds, initial_arrays, train_config, evaluate_config)
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        result = Result()
        t_start = time.time()
        arrays = initial_arrays
        for current_round in range(1, num_rounds + 1):
            log(INFO, "[ROUND %s/%s]", current_round, num_rounds)
            replies = grid.send_and_receive(
                messages=self.configure_train(current_round, arrays, train_config, grid), timeout=timeout
            )
            agg_arrays, agg_train_metrics = self.aggregate_train(current_round, replies)
            if agg_arrays is not None:
                result.arrays = arrays = agg_arrays
            if agg_train_metrics is not None:
                result.train_metrics_clientapp[current_round] = agg_train_metrics
            replies = grid.send_and_receive(
                messages=self.configure_evaluate(current_round, arrays, evaluate_config, grid), timeout=timeout
            )
            agg_evaluate_metrics = self.aggregate_evaluate(current_round, replies)
            if agg_evaluate_metrics is not None:
                result.evaluate_metrics_clientapp[current_round] = agg_evaluate_metrics
            if evaluate_fn:
                res = evaluate_fn(current_round, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[current_round] = res
                    self._update_best_acc(current_round, res["accuracy"], arrays)
            self.save_metrics_as_json(current_round=current_round, result=result)
        log(INFO, "Strategy execution finished in %.2fs", time.time() - t_start)
        return result
