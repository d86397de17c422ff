"""How imap / fmap / omap cut device tensors into tiles: the one definition used everywhere."""
from __future__ import annotations

from .graph import BlockGraph, BlockInput, BlockOutput
from .movement import MovementError, view_shape


class TilingError(ValueError):
    pass


def input_tile_shape(shape: tuple[int, ...], grid: tuple[int, int, int], imap: tuple[int, int, int],
                     fmap: int, forloop: int, what: str = "input") -> tuple[int, ...]:
    """The tile a block sees of a tensor of ``shape`` in one for-loop iteration."""
    tile = list(shape)
    seen: dict[int, int] = {}
    for axis, dim in enumerate(imap):
        if dim == -1:
            continue
        if not 0 <= dim < len(shape):
            raise TilingError(f"{what}: imap maps grid axis {'xyz'[axis]} to dim {dim}, "
                              f"but the tensor {list(shape)} has rank {len(shape)}")
        if dim in seen:
            raise TilingError(f"{what}: grid axes {'xyz'[seen[dim]]} and {'xyz'[axis]} both map to dim {dim}")
        seen[dim] = axis
        if tile[dim] % grid[axis]:
            raise TilingError(f"{what}: dim {dim} of size {tile[dim]} is not divisible by grid "
                              f"axis {'xyz'[axis]} of extent {grid[axis]}")
        tile[dim] //= grid[axis]
    if fmap != -1:
        if not 0 <= fmap < len(shape):
            raise TilingError(f"{what}: fmap {fmap} is not a dim of the tensor {list(shape)}")
        if tile[fmap] % forloop:
            raise TilingError(f"{what}: dim {fmap} chunk of size {tile[fmap]} is not divisible by "
                              f"the for-loop range {forloop}")
        tile[fmap] //= forloop
    return tuple(tile)


def output_shape(tile: tuple[int, ...], grid: tuple[int, int, int], omap: tuple[int, int, int],
                 what: str = "output") -> tuple[int, ...]:
    """The device tensor written by all blocks together from a tile."""
    shape = list(tile)
    seen: dict[int, int] = {}
    for axis, dim in enumerate(omap):
        if dim == -1:
            continue
        if not 0 <= dim < len(tile):
            raise TilingError(f"{what}: omap maps grid axis {'xyz'[axis]} to dim {dim}, "
                              f"but the tile {list(tile)} has rank {len(tile)}")
        if dim in seen:
            raise TilingError(f"{what}: grid axes {'xyz'[seen[dim]]} and {'xyz'[axis]} both map to dim {dim}")
        seen[dim] = axis
        shape[dim] *= grid[axis]
    return tuple(shape)


def reduced_axes(out: BlockOutput, grid: tuple[int, int, int]) -> tuple[int, ...]:
    """Grid axes of extent > 1 that do not tile the output: their blocks must be combined."""
    return tuple(a for a in range(3) if out.omap[a] == -1 and grid[a] > 1)


def block_input_tile(b: BlockGraph, inp: BlockInput, source_shape: tuple[int, ...]) -> tuple[int, ...]:
    what = f"block input %{inp.value.name}"
    if inp.view:
        try:
            source_shape = view_shape(source_shape, inp.view, what)
        except MovementError as e:
            raise TilingError(str(e)) from None
    return input_tile_shape(source_shape, b.grid, inp.imap, inp.fmap, b.forloop, what=what)
