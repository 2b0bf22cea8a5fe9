"""MLflow's models-from-code entry of a tamrun model (https://mlflow.org/docs/latest/ml/model/models-from-code/).

MLflow copies this file into every logged model and executes it when it loads the model: it names
the pyfunc class, whose `load_context` reads the fitted model from the model's artifacts. tamrun
itself never imports this module.
"""

from mlflow.models import set_model

from tamrun.tracking.pyfunc_model import TamPyfuncModel

set_model(TamPyfuncModel())
