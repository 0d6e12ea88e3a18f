"""The sections a run can choose with --only, in the order they run. Adding one (gemm_shapes, models)
is a module with run(ctx: context.Run) and a line here."""
from . import elementwise, gemm_squares, norm, overhead

SECTIONS = {
    "elementwise": elementwise.run,
    "norm": norm.run,
    "gemm": gemm_squares.run,
    "overhead": overhead.run,
}
