"""Worked examples: one small network per entry of the course's Project 2 list, each with a baseline
that lacks the symmetry. ``reports()`` in each module returns the network's reports (they pass, float32
and float64 to rounding) and the baseline's (they fail by a clear margin); ``python -m
gatepool.analysis.symmetry.examples.NAME`` prints them.

    deepsets         DeepSets                  set order             vs an MLP on the flattened set
    set_transformer  Set Transformer           set order             vs the same with positions
    pointnet         PointNet                  point order           vs an MLP on flattened coordinates
    gin              GIN                       node relabeling       vs GIN with node-index features
    gru              GRU                       time shift            vs a GRU reading the time index
    egnn             EGNN                      E(3), node order      vs edges reading raw coordinates
    schnet           SchNet (energy, forces)   E(3), atom order      vs an MLP on raw coordinates
    hnn              Hamiltonian NN            energy conservation   vs an MLP vector field
    gcnn             G-CNN                     p4m                   vs a plain CNN
    spherical        Spherical CNN             cube rotations (S²)   vs an MLP reading the coordinates
"""

EXAMPLES = ("deepsets", "set_transformer", "pointnet", "gin", "gru", "egnn", "schnet", "hnn", "gcnn",
            "spherical")
