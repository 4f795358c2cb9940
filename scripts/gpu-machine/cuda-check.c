/* cuda-check: a CUDA program run inside a rental's container on the GPU
 * machine (issue 46, section 2). It uses the CUDA driver API the way the
 * driver ships it: libcuda.so.1 loaded at run time (no CUDA toolkit to build
 * against, nothing of CUDA in the image: the agent's CDI spec mounts the
 * driver's files). It initialises the driver, lists the devices it sees with
 * their UUIDs (nvidia-smi's spelling), takes a context on the first, allocates
 * MIB MiB there, copies a pattern there and back and compares, then holds the
 * allocation HOLD seconds (so that the agent's telemetry can see the memory
 * taken) before it frees everything.
 *
 *   cuda-check [MIB [HOLD]]      (defaults: 256 MiB, 0 s)
 *
 * Lines begin "cuda-check: "; the last is "PASS" (exit 0) or "FAIL <call>:
 * <error>" (exit 1). Built by scripts/gpu-machine/build-cuda-check.sh.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult; /* 0: CUDA_SUCCESS */
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr; /* the _v2 entry points' 64-bit pointers */
typedef struct {
    unsigned char bytes[16];
} CUuuid;

static struct {
    CUresult (*init)(unsigned int);
    CUresult (*driver_version)(int *);
    CUresult (*device_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_name)(char *, int, CUdevice);
    CUresult (*device_uuid)(CUuuid *, CUdevice);
    CUresult (*total_mem)(size_t *, CUdevice);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*primary_release)(CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*copy_to)(CUdeviceptr, const void *, size_t);
    CUresult (*copy_from)(void *, CUdeviceptr, size_t);
    CUresult (*error_name)(CUresult, const char **);
} cu;

static void *library;

static int fail(const char *call, CUresult result) {
    const char *name = NULL;
    if (cu.error_name == NULL || cu.error_name(result, &name) != 0 || name == NULL) {
        name = "unknown error";
    }
    printf("cuda-check: FAIL %s: %s (%d)\n", call, name, result);
    return 1;
}

/* Each entry point by its exported name: the _v2 names are the 64-bit ones. */
static int load(void) {
    library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        printf("cuda-check: FAIL dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    struct {
        const char *name;
        void **slot;
    } wanted[] = {
        {"cuInit", (void **)&cu.init},
        {"cuDriverGetVersion", (void **)&cu.driver_version},
        {"cuDeviceGetCount", (void **)&cu.device_count},
        {"cuDeviceGet", (void **)&cu.device_get},
        {"cuDeviceGetName", (void **)&cu.device_name},
        {"cuDeviceGetUuid", (void **)&cu.device_uuid},
        {"cuDeviceTotalMem_v2", (void **)&cu.total_mem},
        {"cuDevicePrimaryCtxRetain", (void **)&cu.primary_retain},
        {"cuDevicePrimaryCtxRelease", (void **)&cu.primary_release},
        {"cuCtxSetCurrent", (void **)&cu.set_current},
        {"cuMemAlloc_v2", (void **)&cu.mem_alloc},
        {"cuMemFree_v2", (void **)&cu.mem_free},
        {"cuMemcpyHtoD_v2", (void **)&cu.copy_to},
        {"cuMemcpyDtoH_v2", (void **)&cu.copy_from},
        {"cuGetErrorName", (void **)&cu.error_name},
    };
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
        *wanted[i].slot = dlsym(library, wanted[i].name);
        if (*wanted[i].slot == NULL) {
            printf("cuda-check: FAIL dlsym %s: not in libcuda.so.1\n", wanted[i].name);
            return 1;
        }
    }
    return 0;
}

static void uuid_text(const CUuuid *uuid, char out[41]) {
    const unsigned char *b = uuid->bytes;
    snprintf(out, 41, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

int main(int argc, char **argv) {
    long mib = argc > 1 ? strtol(argv[1], NULL, 10) : 256;
    long hold = argc > 2 ? strtol(argv[2], NULL, 10) : 0;
    if (mib <= 0 || hold < 0) {
        fprintf(stderr, "usage: cuda-check [MIB [HOLD_SECONDS]]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line as it happens, through a terminal or a pipe */
    if (load() != 0) {
        return 1;
    }
    CUresult r;
    int version = 0, count = 0;
    if ((r = cu.init(0)) != 0) {
        return fail("cuInit", r);
    }
    if ((r = cu.driver_version(&version)) != 0) {
        return fail("cuDriverGetVersion", r);
    }
    printf("cuda-check: driver API %d.%d\n", version / 1000, version % 1000 / 10);
    if ((r = cu.device_count(&count)) != 0) {
        return fail("cuDeviceGetCount", r);
    }
    printf("cuda-check: devices %d\n", count);
    for (int i = 0; i < count; i++) {
        CUdevice device;
        CUuuid uuid;
        char name[256] = "", text[41];
        size_t total = 0;
        if ((r = cu.device_get(&device, i)) != 0) {
            return fail("cuDeviceGet", r);
        }
        if ((r = cu.device_name(name, sizeof name, device)) != 0) {
            return fail("cuDeviceGetName", r);
        }
        if ((r = cu.device_uuid(&uuid, device)) != 0) {
            return fail("cuDeviceGetUuid", r);
        }
        if ((r = cu.total_mem(&total, device)) != 0) {
            return fail("cuDeviceTotalMem", r);
        }
        uuid_text(&uuid, text);
        printf("cuda-check: device %d %s %s %zu MiB\n", i, text, name, total >> 20);
    }
    if (count < 1) {
        printf("cuda-check: FAIL no device\n");
        return 1;
    }
    CUdevice device;
    CUcontext context;
    if ((r = cu.device_get(&device, 0)) != 0) {
        return fail("cuDeviceGet", r);
    }
    if ((r = cu.primary_retain(&context, device)) != 0) {
        return fail("cuDevicePrimaryCtxRetain", r);
    }
    if ((r = cu.set_current(context)) != 0) {
        return fail("cuCtxSetCurrent", r);
    }
    size_t bytes = (size_t)mib << 20;
    unsigned char *sent = malloc(bytes), *back = malloc(bytes);
    if (sent == NULL || back == NULL) {
        printf("cuda-check: FAIL malloc %ld MiB twice on the host\n", mib);
        return 1;
    }
    uint32_t state = 2463534242u; /* xorshift: a pattern no zeroed page or stale copy matches */
    for (size_t i = 0; i < bytes; i++) {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        sent[i] = (unsigned char)state;
    }
    memset(back, 0, bytes);
    CUdeviceptr memory;
    if ((r = cu.mem_alloc(&memory, bytes)) != 0) {
        return fail("cuMemAlloc", r);
    }
    if ((r = cu.copy_to(memory, sent, bytes)) != 0) {
        return fail("cuMemcpyHtoD", r);
    }
    if ((r = cu.copy_from(back, memory, bytes)) != 0) {
        return fail("cuMemcpyDtoH", r);
    }
    if (memcmp(sent, back, bytes) != 0) {
        printf("cuda-check: FAIL the %ld MiB copied back differ from those sent\n", mib);
        return 1;
    }
    printf("cuda-check: allocated %ld MiB on device 0, copied there and back: equal\n", mib);
    if (hold > 0) {
        printf("cuda-check: holding %ld MiB for %ld s\n", mib, hold);
        sleep((unsigned int)hold);
    }
    if ((r = cu.mem_free(memory)) != 0) {
        return fail("cuMemFree", r);
    }
    if ((r = cu.primary_release(device)) != 0) {
        return fail("cuDevicePrimaryCtxRelease", r);
    }
    free(sent);
    free(back);
    printf("cuda-check: PASS\n");
    return 0;
}
