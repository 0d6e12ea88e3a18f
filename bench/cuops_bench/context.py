"""What a section is handed: the sizes it runs at, the harness, and the results it adds to."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .harness import Bench, CopyCeiling


@dataclass
class Config:
    sizes: list          # elements per operand of the memory-bound rows
    gemm_squares: list   # M = K = N
    gemm_odd: list       # (M, K, N)


FULL = Config(sizes=[2**16, 2**20, 2**24, 2**28, 2**30],
              gemm_squares=[256, 512, 1024, 2048, 4096, 8192],
              gemm_odd=[(4097, 4097, 4097), (1, 4096, 4096), (4096, 4096, 1), (8192, 1, 8192), (1000, 1000, 1000)])
QUICK = Config(sizes=[2**16, 2**24], gemm_squares=[256, 1024], gemm_odd=[(1000, 1000, 1000), (1, 4096, 4096)])
CPU = Config(sizes=[2**10, 2**14], gemm_squares=[32, 64], gemm_odd=[(33, 17, 9), (1, 64, 64), (64, 64, 1), (64, 1, 64)])


def config_for(device: str, quick: bool, gemm_squares: str | None) -> Config:
    """gemm_squares (a comma list) replaces the square GEMM sizes and drops the odd shapes."""
    cfg = CPU if device == "cpu" else QUICK if quick else FULL
    if gemm_squares is None:
        return cfg
    return dataclasses.replace(cfg, gemm_squares=[int(x) for x in gemm_squares.split(",") if x.strip()], gemm_odd=[])


@dataclass
class Run:
    bench: Bench
    cfg: Config
    results: dict          # the results file's object; sections append to results["rows"]
    ceiling: CopyCeiling

    @property
    def rows(self) -> list:
        return self.results["rows"]
