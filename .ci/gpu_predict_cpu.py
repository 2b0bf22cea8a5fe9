"""For .ci/gpu: in a process that sees no GPU (CUDA_VISIBLE_DEVICES=), load the newest LoggedModel of a run
named argv[2]* of the store argv[1] (fitted on the GPU) and predict the last 500 raw rows of the embedded table."""
import os
import sys
import time

import numpy as np
import pandas as pd

assert os.environ.get("CUDA_VISIBLE_DEVICES") == "", "run with CUDA_VISIBLE_DEVICES="
import mlflow  # noqa: E402
import torch  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from tamrun.data.load import embedded_path  # noqa: E402

assert not torch.cuda.is_available()
mlflow.set_tracking_uri(f"sqlite:///{os.path.abspath(sys.argv[1])}")
client = MlflowClient()
experiments = [e.experiment_id for e in client.search_experiments()]
models = client.search_logged_models(experiment_ids=experiments, max_results=50,
                                     order_by=[{"field_name": "creation_timestamp", "ascending": False}])
model = next(m for m in models if client.get_run(m.source_run_id).info.run_name.startswith(sys.argv[2]))
began = time.time()
loaded = mlflow.pyfunc.load_model(f"models:/{model.model_id}")
rows = pd.read_csv(embedded_path(), parse_dates=["date"]).tail(500)  # the model reads its columns, dates as datetimes
predicted = loaded.predict(rows)["predicted"].to_numpy(dtype=float)
print(f"model {model.name} of run {model.source_run_id}: {predicted.shape[0]} rows predicted without a GPU, "
      f"finite {bool(np.isfinite(predicted).all())}, first {predicted[:3].round(1).tolist()}, {time.time() - began:.1f} s")
sys.exit(0 if np.isfinite(predicted).all() and predicted.shape[0] == 500 else 1)
