"""Verified data sets: MNIST and Fashion-MNIST from IDX files (:mod:`gatepool.data.idx`) and the
generated 60×60 canvases (:mod:`gatepool.data.canvas`)."""

from gatepool.data.idx import (
    DATASETS,
    DEBIAN_DATA,
    DataError,
    Dataset,
    DatasetSpec,
    fetch,
    find_file,
    info,
    load_dataset,
    locate,
    mnist_batch,
    parse_idx,
    read_bytes,
    read_idx,
    repo_data_dir,
    search_roots,
    split_size,
)

__all__ = [
    "DATASETS",
    "DEBIAN_DATA",
    "DataError",
    "Dataset",
    "DatasetSpec",
    "fetch",
    "find_file",
    "info",
    "load_dataset",
    "locate",
    "mnist_batch",
    "parse_idx",
    "read_bytes",
    "read_idx",
    "repo_data_dir",
    "search_roots",
    "split_size",
]
