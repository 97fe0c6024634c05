"""Signal-propagation probe: the lecture's ideal variance beside the measured one, module by module.

    from gatepool.analysis.probe import measure, predict, save_figures
    report = measure(model, images, backward="unit-noise")   # ideal (predict) set beside measured
    print(report.table()); save_figures(report, "out/")

``theory`` holds the lecture's formulas (pure functions), ``rules`` applies them by module type
(``register_rule(ModuleType, rule)`` adds one for any module), ``predict`` walks them through a model,
``measure`` records forward moments and activation-gradient moments with hooks, ``report`` and
``figures`` show them. A model without a rule is traced by ``torch.fx`` (``graph``) and its
call_function / call_method nodes follow ``functions`` (``register_function_rule(target, rule)``);
``build_model("torchvision:resnet18")`` builds a model of torchvision or timm (``external_models``).

The correlation-aware prediction (``predicted`` beside ``ideal`` and ``measured``) lives in
``correlated`` (the state: mean map, variance map, correlation at every lag; the rules) and
``correlated_predict`` (``predict_correlated(model, measure_input(batch))``, a torch.fx walk;
``register_correlated_rule(ModuleType or function, rule)`` adds one for a block of yours), and
``measure(model, batch, correlated=True)`` sets it beside the measurement. The three rule tables are each
a ``registry.Registry``.
"""

from gatepool.analysis.probe.correlated_predict import predict_correlated, register_correlated_rule
from gatepool.analysis.probe.external_models import build_model
from gatepool.analysis.probe.figures import save_figures
from gatepool.analysis.probe.functions import Call, Op, TensorIn, function_rule_for, register_function_rule
from gatepool.analysis.probe.measure import measure
from gatepool.analysis.probe.predict import INPUT, OUTPUT, Ideal, Prediction, predict
from gatepool.analysis.probe.report import ParamRow, ProbeReport, Row, TensorStats
from gatepool.analysis.probe.rules import (
    Chain,
    GradMoments,
    Leaf,
    Moments,
    NoRule,
    Residual,
    Site,
    need,
    register_rule,
    rule_for,
)
from gatepool.analysis.probe.theory import (
    activation_moments,
    avg_pool_backward,
    avg_pool_forward,
    cross_entropy_grad,
    linear_backward,
    linear_forward,
    max_of_normals,
    max_of_rectified_normals,
    max_pool_backward,
    max_pool_forward,
    norm_backward,
    padding_variance_map,
    relu_backward,
    relu_moments,
    residual_add,
)

__all__ = [
    "INPUT",
    "OUTPUT",
    "Call",
    "Chain",
    "GradMoments",
    "Ideal",
    "Leaf",
    "Moments",
    "NoRule",
    "Op",
    "ParamRow",
    "Prediction",
    "ProbeReport",
    "Residual",
    "Row",
    "Site",
    "TensorIn",
    "TensorStats",
    "activation_moments",
    "avg_pool_backward",
    "avg_pool_forward",
    "build_model",
    "cross_entropy_grad",
    "function_rule_for",
    "linear_backward",
    "linear_forward",
    "max_of_normals",
    "max_of_rectified_normals",
    "max_pool_backward",
    "max_pool_forward",
    "measure",
    "need",
    "norm_backward",
    "padding_variance_map",
    "predict",
    "predict_correlated",
    "register_correlated_rule",
    "register_function_rule",
    "register_rule",
    "relu_backward",
    "relu_moments",
    "residual_add",
    "rule_for",
    "save_figures",
]
