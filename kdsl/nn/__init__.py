"""Swap kdsl operators into PyTorch networks: :func:`replace` puts an operator's module in place
of every ``nn.Conv2d`` of a model that the operator serves, and reports what it replaced and what it
left, and why (:class:`Report`); :mod:`kdsl.nn.conv_fit` decides whether an operator serves a conv.
:func:`resnet18` is torchvision's ResNet-18 without torchvision, to try it on.

Torch loads when this package does (``import kdsl`` does not import it: ``kdsl.nn`` loads on first
use).

>>> import torch, kdsl
>>> model = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, stride=2, padding=1))
>>> model, report = kdsl.nn.replace(model, kdsl.gallery.load("grouped_conv2d"), coefficients={"G": 2})
>>> [name for name, _ in report.replaced], report.left
(['0'], [('1', '3x3 conv 8->8, stride 2: stride 2, the operator keeps the resolution (it has no stride)')])
"""

from kdsl.nn.conv_fit import ConvSpec, Fit, fit
from kdsl.nn.replace import Report, replace
from kdsl.nn.resnet import resnet18

__all__ = ["ConvSpec", "Fit", "Report", "fit", "replace", "resnet18"]
