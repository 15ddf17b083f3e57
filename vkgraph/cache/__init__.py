"""The packed-weight cache file: packed bytes from one load, reused by the next."""

from .format import Entry, PackedWeightFile, checksum, write_file

__all__ = ["Entry", "PackedWeightFile", "checksum", "write_file"]
