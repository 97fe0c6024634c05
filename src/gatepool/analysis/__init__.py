"""Analysis tools for any ``nn.Module``: the signal-propagation probe (``probe/``), the symmetry tester
(``symmetry/``) and attention-map tools (``attention_maps.py``). Nothing here knows a particular model."""
