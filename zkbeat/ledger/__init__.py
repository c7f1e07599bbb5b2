"""What ran: each entry's ledger znode, its recent runs, the clocks that write it, and the controls beside it."""
