"""An executable model of the Tofino (TNA) program p4/tna/ina_tna.p4.

A data-plane backend of its own (it imports no other backend, and of hostlib nothing):
the program's registers, RegisterActions under Tofino's stateful-ALU limits, tables and
counters in Python, run pass by pass on frames, so the data-plane vectors can hold the
TNA program to the soft switch's semantics where no Tofino is at hand.
"""

from emulation.tnamodel.model import TableError, TnaModel
from emulation.tnamodel.program import ProgramError
from emulation.tnamodel.stateful import TofinoLimitError

__all__ = ["ProgramError", "TableError", "TnaModel", "TofinoLimitError"]
