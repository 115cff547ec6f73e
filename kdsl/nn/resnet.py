"""ResNet-18 in plain PyTorch (He et al. 2016, the ImageNet variant), without torchvision: the same
modules, names and initialisation as ``torchvision.models.resnet18`` (``conv1``, ``bn1``,
``layer1`` ... ``layer4`` of two :class:`BasicBlock` each, ``downsample`` 1x1 projections,
``fc``), so :func:`kdsl.nn.replace` reports the same names on it as on torchvision's, and its
``state_dict`` loads torchvision's. Its classes live at module level: a whole network pickles
(``torch.save(model)``).

>>> import torch
>>> model = resnet18(num_classes=10)
>>> tuple(model(torch.zeros(2, 3, 32, 32)).shape), sum(p.numel() for p in model.parameters())
((2, 10), 11181642)
"""

from __future__ import annotations

from typing import Any

from kdsl.codegen.torch import load_torch
from kdsl.lang.errors import KdslError

torch = load_torch()
nn = torch.nn

__all__ = ["BasicBlock", "ResNet", "resnet18"]


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut (a 1x1 projection where the block
    changes the width or halves the resolution)."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: Any = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: Any) -> Any:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class ResNet(nn.Module):
    """A ResNet of basic blocks: a 7x7 stride-2 stem and 3x3 max pooling, four stages at 64, 128,
    256 and 512 channels (``blocks`` per stage; the last three open with a stride-2 block), global
    average pooling and a linear classifier."""

    def __init__(self, blocks: tuple[int, int, int, int] = (2, 2, 2, 2), num_classes: int = 1000) -> None:
        super().__init__()
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
            raise KdslError(f"the number of classes must be a positive integer, got {num_classes!r}")
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = 64
        for index, (planes, count) in enumerate(zip((64, 128, 256, 512), blocks)):
            stride = 1 if index == 0 else 2
            layer = [BasicBlock(inplanes, planes, stride)] + [BasicBlock(planes, planes) for _ in range(count - 1)]
            setattr(self, f"layer{index + 1}", nn.Sequential(*layer))
            inplanes = planes
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for module in self.modules():  # torchvision's initialisation
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.constant_(module.weight, 1)
                nn.init.constant_(module.bias, 0)

    def forward(self, x: Any) -> Any:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000) -> ResNet:
    """ResNet-18 with random weights (torchvision's ``resnet18()`` without torchvision).

    >>> [name for name, module in resnet18().named_modules() if isinstance(module, torch.nn.Conv2d)][:4]
    ['conv1', 'layer1.0.conv1', 'layer1.0.conv2', 'layer1.1.conv1']
    """
    return ResNet((2, 2, 2, 2), num_classes)
