"""libnrt from Python through ctypes, as a framework binding would load it.

    python3 ctypes_smoke.py PATH/TO/libnrt.so ADD.neff

Loads the library, starts the runtime, runs ADD.neff (input0 + input1 of f32[4]) with
nrt_execute and checks the sum, checks that misuse returns the documented codes, and
closes. Prints "ctypes ok" when every check passed.
"""

import ctypes
import struct
import sys

NRT_SUCCESS, NRT_INVALID, NRT_INVALID_HANDLE, NRT_CLOSED = 0, 2, 3, 14
NRT_TENSOR_PLACEMENT_DEVICE, NRT_FRAMEWORK_TYPE_NO_FW = 0, 1


def main(library, neff_path):
    nrt = ctypes.CDLL(library)
    handle = ctypes.c_void_p

    def check(status, expected=NRT_SUCCESS):
        if status != expected:
            raise SystemExit(f"status {status}, expected {expected}")

    count = ctypes.c_uint32()
    check(nrt.nrt_get_total_vnc_count(ctypes.byref(count)))
    assert count.value >= 1, count.value
    check(nrt.nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, b"python", None))

    neff = open(neff_path, "rb").read()
    model = handle()
    check(nrt.nrt_load(neff, ctypes.c_size_t(len(neff)), -1, -1, ctypes.byref(model)))

    def tensor(name, values):
        t = handle()
        check(nrt.nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, ctypes.c_size_t(16), name, ctypes.byref(t)))
        data = struct.pack("<4f", *values)
        check(nrt.nrt_tensor_write(t, data, ctypes.c_size_t(0), ctypes.c_size_t(16)))
        return t

    x, y, out = tensor(b"x", [1, 2, 3, 4]), tensor(b"y", [0.5, 0.5, 0.5, 0.5]), tensor(b"out", [0, 0, 0, 0])
    inputs, outputs = handle(), handle()
    check(nrt.nrt_allocate_tensor_set(ctypes.byref(inputs)))
    check(nrt.nrt_allocate_tensor_set(ctypes.byref(outputs)))
    check(nrt.nrt_add_tensor_to_tensor_set(inputs, b"input0", x))
    check(nrt.nrt_add_tensor_to_tensor_set(inputs, b"input1", y))
    check(nrt.nrt_add_tensor_to_tensor_set(outputs, b"output0", out))
    check(nrt.nrt_execute(model, inputs, outputs))
    buffer = ctypes.create_string_buffer(16)
    check(nrt.nrt_tensor_read(out, buffer, ctypes.c_size_t(0), ctypes.c_size_t(16)))
    assert struct.unpack("<4f", buffer.raw) == (1.5, 2.5, 3.5, 4.5), struct.unpack("<4f", buffer.raw)

    # Misuse gets the documented codes, not a crash.
    check(nrt.nrt_tensor_read(None, buffer, ctypes.c_size_t(0), ctypes.c_size_t(16)), NRT_INVALID)
    check(nrt.nrt_tensor_read(handle(0xDEAD0), buffer, ctypes.c_size_t(0), ctypes.c_size_t(16)), NRT_INVALID_HANDLE)
    check(nrt.nrt_execute(model, outputs, inputs), NRT_INVALID)

    nrt.nrt_close()
    check(nrt.nrt_tensor_read(out, buffer, ctypes.c_size_t(0), ctypes.c_size_t(16)), NRT_CLOSED)
    print("ctypes ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
