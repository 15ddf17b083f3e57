"""Readers of an ExecuTorch program (``.pte``: program.fbs, identifier "ET12") and of the
ET-VK delegate blobs inside it ("VH00" header + VkGraph flatbuffer, identifier "VK00").

The file is memory-mapped once. The flatbuffers (small: weights live in segments) are read
eagerly into the plain dataclasses below through the readers flatc generated
(``_program_fb.py``, ``_vkgraph_fb.py``: scripts/gen_pte_readers.py); weights are never copied:
a constant is a ``(file offset, nbytes)`` region of the mapping. Every length, offset and index
is checked against the file: a malformed file is a :class:`PteFormatError` naming the file and
what is wrong, never a traceback from the flatbuffers runtime.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import PteFormatError
from . import _program_fb as pfb
from . import _vkgraph_fb as vfb

#: ExecuTorch ScalarType -> numpy dtype (the types a program's tensors use here).
SCALAR_TYPES = {0: np.uint8, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.int64, 5: np.float16, 6: np.float32,
                7: np.float64, 11: np.bool_}
#: ET-VK VkDataType -> numpy dtype.
VK_DATA_TYPES = {0: np.bool_, 1: np.uint8, 2: np.int8, 3: np.int32, 4: np.float16, 5: np.float32, 6: np.float64,
                 7: np.int64}
VK_STORAGE = {0: "buffer", 1: "texture3d", 2: "texture2d", 255: ""}
VK_LAYOUT = {0: "width_packed", 1: "height_packed", 2: "channels_packed", 3: "packed_int8_4w4c", 4: "packed_int8_4h4w",
             5: "packed_int8_4w", 6: "packed_int8_4c", 8: "packed_int8_4c1w", 9: "packed_int8_conv2d", 255: ""}
NAMED_DATA = 2**64 - 1  # VkBytes.offset of a constant kept in the program's named data
VULKAN_BACKEND = "VulkanBackend"


# --- the program -----------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    """A tensor EValue: dtype, sizes, and where its bytes are for a constant (``data``: file
    offset and size) or ``None`` for one the program computes or receives. ``dynamic``: exported
    with dynamic shapes, ``sizes`` being their upper bounds."""

    dtype: np.dtype
    sizes: tuple[int, ...]
    data: tuple[int, int] | None = None
    dynamic: bool = False


@dataclass(frozen=True)
class EValue:
    kind: str  # null int bool double tensor string int_list double_list bool_list tensor_list optional_tensor_list
    value: Any = None


@dataclass(frozen=True)
class Instruction:
    kind: str  # kernel delegate move jump_false free
    index: int = 0  # op_index / delegate_index / move_from / cond_value_index / value_index
    args: tuple[int, ...] = ()  # kernel and delegate arguments
    target: int = 0  # move_to / destination_instruction


@dataclass(frozen=True)
class Delegate:
    """A backend delegate: its id ("VulkanBackend") and where its blob is in the file."""

    id: str
    offset: int
    nbytes: int


@dataclass
class ExecutionPlan:
    name: str
    values: list[EValue]
    inputs: list[int]
    outputs: list[int]
    instructions: list[Instruction]
    operators: list[str]  # "aten::mean.out"
    delegates: list[Delegate]


# --- a VkGraph -------------------------------------------------------------------------------

@dataclass(frozen=True)
class VkTensorInfo:
    dtype: np.dtype
    dims: tuple[int, ...]
    constant_id: int
    mem_obj_id: int
    storage: str  # "" = the graph's override or the default
    layout: str


@dataclass(frozen=True)
class VkValue:
    kind: str  # null int double bool tensor int_list double_list bool_list value_list string symint
    value: Any = None


@dataclass(frozen=True)
class OperatorCall:
    node_id: int
    name: str
    args: tuple[int, ...]


@dataclass
class VkGraphInfo:
    version: str
    values: list[VkValue]
    chain: list[OperatorCall]
    input_ids: list[int]
    output_ids: list[int]
    constants: list[tuple[int, int]]  # (file offset, nbytes) per constant id, named data resolved
    storage_override: str = ""
    layout_override: str = ""
    shaders: int = 0


class _Checker:
    """Bounds checks for one flatbuffer: a vector of ``n`` elements of at least ``size`` bytes
    must fit in the buffer (a corrupt length must never make a reader loop for minutes)."""

    def __init__(self, path: str, what: str, nbytes: int):
        self.path, self.what, self.nbytes = path, what, nbytes

    def fail(self, reason: str) -> PteFormatError:
        return PteFormatError(f"{self.path}: {self.what}: {reason}")

    def count(self, n: int, size: int, what: str) -> int:
        if n < 0 or n * size > self.nbytes:
            raise self.fail(f"{what} claims {n} entries, more than the {self.nbytes}-byte flatbuffer holds")
        return n

    def index(self, i: int, n: int, what: str) -> int:
        if not 0 <= i < n:
            raise self.fail(f"{what} {i} is out of range (0..{n - 1})")
        return i


def _np(value: Any) -> np.ndarray:
    """A flatbuffers ``...AsNumpy()`` result (0 when the vector is absent) as an array."""
    return np.zeros(0, np.int64) if isinstance(value, int) else value


def _str(b: bytes | None) -> str:
    return b.decode("utf-8", "replace") if b else ""


class PteFile:
    """An ExecuTorch program file, mapped. Use as a context manager (or :meth:`close`)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 64:
                    raise PteFormatError(f"{self.path}: {size} bytes is too short for an ExecuTorch program")
                # Private and writable (never written): NVIDIA's driver imports such pages, not read-only ones.
                self.mapping = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE,
                                         prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            raise PteFormatError(f"{self.path}: cannot read the file ({exc.strerror or exc})") from None
        self.nbytes = size
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    def _fail(self, reason: str) -> PteFormatError:
        return PteFormatError(f"{self.path}: {reason}")

    def _parse(self) -> None:
        m = self.mapping
        if m[4:8] != b"ET12":
            ident = bytes(m[4:8])
            raise self._fail(f"not an ExecuTorch program of a version vkgraph reads (identifier {ident!r}, "
                             "expected b'ET12')")
        program_size, self.segment_base = len(m), 0
        if m[8:12] == b"eh00":
            hlen, program_size, self.segment_base = struct.unpack_from("<IQQ", m, 12)
            if hlen < 24 or program_size > len(m) or self.segment_base > len(m) or (
                    self.segment_base and self.segment_base < program_size):
                raise self._fail(f"extended header is inconsistent (program {program_size} bytes, segments at "
                                 f"{self.segment_base}, file {len(m)} bytes)")
        buf = bytes(m[:program_size])  # the flatbuffer only: weights stay in the mapping
        chk = _Checker(self.path, "program", len(buf))
        try:
            self._read_program(buf, chk)
        except PteFormatError:
            raise
        except (struct.error, IndexError, ValueError, TypeError, AttributeError, OverflowError,
                UnicodeDecodeError) as exc:
            raise self._fail(f"program flatbuffer is malformed ({type(exc).__name__}: {exc})") from None

    def _read_program(self, buf: bytes, chk: _Checker) -> None:
        prog = pfb.Program.GetRootAs(buf, 0)
        self.version = prog.Version()
        n_seg = chk.count(prog.SegmentsLength(), 8, "segments")
        self.segments: list[tuple[int, int]] = []
        for i in range(n_seg):
            seg = prog.Segments(i)
            off, size = self.segment_base + seg.Offset(), seg.Size()
            if off + size > self.nbytes:
                raise chk.fail(f"segment {i} ({size} bytes at {off}) runs past the end of the file "
                               f"({self.nbytes} bytes): truncated?")
            self.segments.append((off, size))
        self.named_data: dict[str, tuple[int, int]] = {}
        for i in range(chk.count(prog.NamedDataLength(), 8, "named data")):
            nd = prog.NamedData(i)
            self.named_data[_str(nd.Key())] = self.segments[chk.index(nd.SegmentIndex(), n_seg, "named data segment")]
        self._constant_offsets: list[int] = []
        self._constant_segment = None
        cs = prog.ConstantSegment()
        if cs is not None and cs.OffsetsLength():
            seg = chk.index(cs.SegmentIndex(), n_seg, "constant segment")
            chk.count(cs.OffsetsLength(), 8, "constant offsets")
            self._constant_segment = self.segments[seg]
            self._constant_offsets = [int(o) for o in _np(cs.OffsetsAsNumpy())]
        chk.count(prog.ConstantBufferLength(), 4, "constant buffers")  # checked; a tensor in them is refused below
        inline_delegates = []
        for i in range(chk.count(prog.BackendDelegateDataLength(), 4, "delegate data")):
            d = prog.BackendDelegateData(i)
            # inline data lives in the flatbuffer (which starts the file): its file offset is its position
            o = d._tab.Offset(4)
            start = d._tab.Vector(o) if o else 0
            inline_delegates.append((start, d.DataLength() if o else 0))
        self._inline_delegates = inline_delegates
        self.plans = [self._read_plan(prog.ExecutionPlan(i), chk)
                      for i in range(chk.count(prog.ExecutionPlanLength(), 4, "execution plans"))]
        if not self.plans:
            raise chk.fail("the program has no execution plan")

    def _read_plan(self, ep: Any, chk: _Checker) -> ExecutionPlan:
        values = [self._read_evalue(ep.Values(i), chk, i) for i in range(chk.count(ep.ValuesLength(), 4, "values"))]
        n = len(values)
        for i, v in enumerate(values):  # lists of value indices (-1: none, in optional tensor lists)
            if v.kind in ("int_list", "tensor_list", "optional_tensor_list"):
                for j in v.value:
                    if not -1 <= j < n or (j == -1 and v.kind != "optional_tensor_list"):
                        raise chk.fail(f"value {i} ({v.kind}) refers to value {j}, outside 0..{n - 1}")
        inputs = [chk.index(int(i), n, "plan input") for i in _np(ep.InputsAsNumpy())]
        outputs = [chk.index(int(i), n, "plan output") for i in _np(ep.OutputsAsNumpy())]
        operators = []
        for i in range(chk.count(ep.OperatorsLength(), 4, "operators")):
            op = ep.Operators(i)
            name, overload = _str(op.Name()), _str(op.Overload())
            operators.append(f"{name}.{overload}" if overload else name)
        delegates = []
        for i in range(chk.count(ep.DelegatesLength(), 4, "delegates")):
            d = ep.Delegates(i)
            ref = d.Processed()
            if ref is None:
                raise chk.fail(f"delegate {i} has no data")
            if ref.Location() == pfb.DataLocation.SEGMENT:
                off, size = self.segments[chk.index(ref.Index(), len(self.segments), f"delegate {i} segment")]
            else:
                off, size = self._inline_delegates[chk.index(ref.Index(), len(self._inline_delegates),
                                                             f"delegate {i} inline data")]
            delegates.append(Delegate(_str(d.Id()), off, size))
        instructions: list[Instruction] = []
        if chk.count(ep.ChainsLength(), 4, "chains") != 1:
            raise chk.fail(f"plan {_str(ep.Name())!r} has {ep.ChainsLength()} chains; vkgraph runs programs of one")
        chain = ep.Chains(0)
        for i in range(chk.count(chain.InstructionsLength(), 4, "instructions")):
            instructions.append(self._read_instruction(chain.Instructions(i), chk, i, n, len(operators),
                                                       len(delegates)))
        return ExecutionPlan(_str(ep.Name()), values, inputs, outputs, instructions, operators, delegates)

    def _read_instruction(self, ins: Any, chk: _Checker, i: int, n_values: int, n_ops: int,
                          n_delegates: int) -> Instruction:
        kind = ins.InstrArgsType()
        tab = ins.InstrArgs()
        if tab is None:
            raise chk.fail(f"instruction {i} has no arguments")
        A = pfb.InstructionArguments
        if kind in (A.KernelCall, A.DelegateCall):
            call = (pfb.KernelCall if kind == A.KernelCall else pfb.DelegateCall)()
            call.Init(tab.Bytes, tab.Pos)
            args = tuple(chk.index(int(a), n_values, f"instruction {i} argument") for a in _np(call.ArgsAsNumpy()))
            if kind == A.KernelCall:
                return Instruction("kernel", chk.index(call.OpIndex(), n_ops, f"instruction {i} operator"), args)
            return Instruction("delegate", chk.index(call.DelegateIndex(), n_delegates, f"instruction {i} delegate"),
                               args)
        if kind == A.MoveCall:
            mv = pfb.MoveCall()
            mv.Init(tab.Bytes, tab.Pos)
            return Instruction("move", chk.index(mv.MoveFrom(), n_values, "move source"),
                               target=chk.index(mv.MoveTo(), n_values, "move target"))
        if kind == A.JumpFalseCall:
            jf = pfb.JumpFalseCall()
            jf.Init(tab.Bytes, tab.Pos)
            return Instruction("jump_false", chk.index(jf.CondValueIndex(), n_values, "jump condition"),
                               target=jf.DestinationInstruction())
        if kind == A.FreeCall:
            fc = pfb.FreeCall()
            fc.Init(tab.Bytes, tab.Pos)
            return Instruction("free", chk.index(fc.ValueIndex(), n_values, "freed value"))
        raise chk.fail(f"instruction {i} has unknown kind {kind}")

    def _read_evalue(self, ev: Any, chk: _Checker, i: int) -> EValue:
        kind = ev.ValType()
        tab = ev.Val()
        K = pfb.KernelTypes
        if kind in (K.NONE, K.Null) or tab is None:
            return EValue("null")
        table = {K.Int: pfb.Int, K.Bool: pfb.Bool, K.Double: pfb.Double, K.Tensor: pfb.Tensor, K.String: pfb.String,
                 K.IntList: pfb.IntList, K.DoubleList: pfb.DoubleList, K.BoolList: pfb.BoolList,
                 K.TensorList: pfb.TensorList, K.OptionalTensorList: pfb.OptionalTensorList}.get(kind)
        if table is None:
            raise chk.fail(f"value {i} has unknown type {kind}")
        v = table()
        v.Init(tab.Bytes, tab.Pos)
        if kind == K.Int:
            return EValue("int", v.IntVal())
        if kind == K.Bool:
            return EValue("bool", bool(v.BoolVal()))
        if kind == K.Double:
            return EValue("double", v.DoubleVal())
        if kind == K.String:
            return EValue("string", _str(v.StringVal()))
        if kind == K.Tensor:
            return EValue("tensor", self._tensor_info(v, chk, i))
        # IntList, TensorList and OptionalTensorList hold value indices (-1: none); the other lists values
        name = {K.IntList: "int_list", K.DoubleList: "double_list", K.BoolList: "bool_list", K.TensorList: "tensor_list",
                K.OptionalTensorList: "optional_tensor_list"}[kind]
        return EValue(name, tuple(x.item() for x in _np(v.ItemsAsNumpy())))

    def _tensor_info(self, t: Any, chk: _Checker, i: int) -> TensorInfo:
        st = t.ScalarType()
        if st not in SCALAR_TYPES:
            raise chk.fail(f"tensor value {i} has scalar type {st}, which vkgraph does not support")
        dtype = np.dtype(SCALAR_TYPES[st])
        sizes = tuple(int(s) for s in _np(t.SizesAsNumpy()))
        if any(s < 0 for s in sizes):
            raise chk.fail(f"tensor value {i} has negative sizes {sizes}")
        nbytes = int(np.prod(sizes, dtype=np.int64)) * dtype.itemsize
        data = None
        idx = t.DataBufferIdx()
        if idx > 0 and t.AllocationInfo() is None:  # a constant
            if self._constant_segment is None:
                raise chk.fail(f"tensor value {i} is a constant in the program's inline constant buffer; "
                               "vkgraph reads programs with a constant segment")
            chk.index(idx, len(self._constant_offsets), f"tensor value {i} constant")
            seg_off, seg_size = self._constant_segment
            off = self._constant_offsets[idx]
            if off + nbytes > seg_size:
                raise chk.fail(f"constant tensor value {i} ({nbytes} bytes at {off}) runs past its segment "
                               f"({seg_size} bytes)")
            data = (seg_off + off, nbytes)
        return TensorInfo(dtype, sizes, data, t.ShapeDynamism() != pfb.TensorShapeDynamism.STATIC)

    # --- what callers use -------------------------------------------------------------------

    def plan(self, name: str = "forward") -> ExecutionPlan:
        for p in self.plans:
            if p.name == name:
                return p
        if len(self.plans) == 1:
            return self.plans[0]
        raise PteFormatError(f"{self.path}: no method {name!r}; methods: {', '.join(p.name for p in self.plans)}")

    def array(self, offset: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        """A read-only view of bytes of the mapping (no copy)."""
        return np.frombuffer(self.mapping, np.uint8, nbytes, offset).view(dtype).reshape(shape)

    def vkgraph(self, delegate: Delegate) -> VkGraphInfo:
        """The VkGraph of an ET-VK delegate, its constants resolved to file regions."""
        return read_vkgraph(self, delegate)

    def close(self) -> None:
        m = getattr(self, "mapping", None)
        if m is not None:
            try:
                m.close()
            except BufferError:
                pass  # arrays still view it: the mapping goes when they do
            self.mapping = None

    def __enter__(self) -> PteFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_vkgraph(pte: PteFile, delegate: Delegate) -> VkGraphInfo:
    where = f"{pte.path}: delegate {delegate.id!r} at {delegate.offset}"
    if delegate.id != VULKAN_BACKEND:
        raise PteFormatError(f"{where} is not an ET-VK ({VULKAN_BACKEND}) delegate")
    m, base, size = pte.mapping, delegate.offset, delegate.nbytes
    if size < 32 or m[base + 4:base + 8] != b"VH00":
        raise PteFormatError(f"{where}: the blob has no 'VH00' header (got {bytes(m[base + 4:base + 8])!r})")
    hlen, fb_off, fb_size, bytes_off, bytes_size = struct.unpack_from("<HIIIQ", m, base + 8)
    if hlen != 30 or fb_off + fb_size > size or bytes_off + bytes_size > size or fb_size < 8:
        raise PteFormatError(f"{where}: the 'VH00' header is inconsistent (header {hlen} bytes, flatbuffer "
                             f"{fb_size} at {fb_off}, bytes {bytes_size} at {bytes_off}, blob {size})")
    buf = bytes(m[base + fb_off:base + fb_off + fb_size])
    if buf[4:8] != b"VK00":
        raise PteFormatError(f"{where}: the graph is not a VkGraph of a version vkgraph reads (identifier "
                             f"{buf[4:8]!r}, expected b'VK00')")
    chk = _Checker(pte.path, f"delegate {delegate.id!r} at {delegate.offset}", len(buf))
    try:
        return _read_vkgraph(buf, chk, pte, base + bytes_off, bytes_size)
    except PteFormatError:
        raise
    except (struct.error, IndexError, ValueError, TypeError, AttributeError, OverflowError,
            UnicodeDecodeError) as exc:
        raise chk.fail(f"VkGraph flatbuffer is malformed ({type(exc).__name__}: {exc})") from None


def _read_vkgraph(buf: bytes, chk: _Checker, pte: PteFile, bytes_base: int, bytes_size: int) -> VkGraphInfo:
    g = vfb.VkGraph.GetRootAs(buf, 0)
    n = chk.count(g.ValuesLength(), 4, "values")
    values = [_read_vkvalue(g.Values(i), chk, i) for i in range(n)]
    chain = []
    for i in range(chk.count(g.ChainLength(), 4, "chain")):
        op = g.Chain(i)
        args = tuple(chk.index(int(a), n, f"argument of operator {i}") for a in _np(op.ArgsAsNumpy()))
        chain.append(OperatorCall(op.NodeId(), _str(op.Name()), args))
    input_ids = [chk.index(int(i), n, "graph input") for i in _np(g.InputIdsAsNumpy())]
    output_ids = [chk.index(int(i), n, "graph output") for i in _np(g.OutputIdsAsNumpy())]
    for i in input_ids + output_ids:
        if values[i].kind != "tensor":
            raise chk.fail(f"graph input/output value {i} is a {values[i].kind}, not a tensor")
    constants = []
    for i in range(chk.count(g.ConstantsLength(), 4, "constants")):
        c = g.Constants(i)
        off, length = c.Offset(), c.Length()
        if off == NAMED_DATA:
            key = _str(c.NamedKey())
            if key not in pte.named_data:
                raise chk.fail(f"constant {i} names data {key!r}, which the program does not hold")
            seg_off, seg_size = pte.named_data[key]
            if length > seg_size:
                raise chk.fail(f"constant {i} ({key!r}) is {length} bytes, its segment {seg_size}")
            constants.append((seg_off, length))
        else:
            if off + length > bytes_size:
                raise chk.fail(f"constant {i} ({length} bytes at {off}) lies outside the blob's "
                               f"{bytes_size} bytes of data")
            constants.append((bytes_base + off, length))
    for i, v in enumerate(values):
        if v.kind == "tensor" and v.value.constant_id >= 0:
            cid = chk.index(v.value.constant_id, len(constants), f"constant id of value {i}")
            need = int(np.prod(v.value.dims, dtype=np.int64)) * v.value.dtype.itemsize
            if constants[cid][1] < need:
                raise chk.fail(f"constant {cid} of value {i} holds {constants[cid][1]} bytes; its tensor "
                               f"{v.value.dims} {v.value.dtype} needs {need}")
    return VkGraphInfo(_str(g.Version()), values, chain, input_ids, output_ids, constants,
                       VK_STORAGE.get(g.StorageTypeOverride(), ""), VK_LAYOUT.get(g.MemoryLayoutOverride(), ""),
                       g.ShadersLength())


def _read_vkvalue(v: Any, chk: _Checker, i: int) -> VkValue:
    kind = v.ValueType()
    tab = v.Value()
    G = vfb.GraphTypes
    if kind in (G.NONE, G.Null) or tab is None:
        return VkValue("null")
    cls = {G.Int: vfb.Int, G.Double: vfb.Double, G.Bool: vfb.Bool, G.VkTensor: vfb.VkTensor, G.IntList: vfb.IntList,
           G.DoubleList: vfb.DoubleList, G.BoolList: vfb.BoolList, G.ValueList: vfb.ValueList, G.String: vfb.String,
           G.SymInt: vfb.SymInt}.get(kind)
    if cls is None:
        raise chk.fail(f"value {i} has unknown type {kind}")
    x = cls()
    x.Init(tab.Bytes, tab.Pos)
    if kind == G.Int:
        return VkValue("int", x.IntVal())
    if kind == G.Double:
        return VkValue("double", x.DoubleVal())
    if kind == G.Bool:
        return VkValue("bool", bool(x.BoolVal()))
    if kind == G.String:
        return VkValue("string", _str(x.StringVal()))
    if kind == G.SymInt:
        return VkValue("symint", x.Value())
    if kind == G.VkTensor:
        dt = x.Datatype()
        if dt not in VK_DATA_TYPES:
            raise chk.fail(f"tensor value {i} has data type {dt}, which vkgraph does not support")
        dims = tuple(int(d) for d in _np(x.DimsAsNumpy()))
        return VkValue("tensor", VkTensorInfo(np.dtype(VK_DATA_TYPES[dt]), dims, x.ConstantId(), x.MemObjId(),
                                              VK_STORAGE.get(x.StorageType(), ""), VK_LAYOUT.get(x.MemoryLayout(), "")))
    name = {G.IntList: "int_list", G.DoubleList: "double_list", G.BoolList: "bool_list", G.ValueList: "value_list"}[kind]
    items = tuple(x.item() for x in _np(x.ItemsAsNumpy()))
    if kind == G.ValueList:
        items = tuple(int(a) for a in items)
    return VkValue(name, items)
