"""Run inside a sandbox: make an i386 system call (int 0x80) from this 64-bit process.

The machine code is eight bytes, run through ctypes from an executable page:

    b8 14 00 00 00    mov eax, 20      ; getpid in the i386 table
    cd 80             int 0x80         ; enter the kernel through the i386 ABI
    c3                ret              ; eax: the pid, or -errno

Prints the returned value: the pid when the call ran, -1 (-EPERM) when refused.
"""

import ctypes
import mmap

CODE = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(CODE)
address = ctypes.addressof(ctypes.c_char.from_buffer(page))
print(ctypes.CFUNCTYPE(ctypes.c_int)(address)())
