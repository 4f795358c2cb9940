/* A stand-in libcuda.so.1 for the machines without a GPU (issue 46): the CUDA
 * driver-API entry points scripts/gpu-machine/cuda-check.c calls, answering
 * as the driver does from what the process can open. A device is a character
 * device /dev/nvidia<N> the process sees (the one a CDI spec mounts into a
 * container), beside /dev/nvidiactl; its UUID is the one the stand-in NVML
 * gives minor N, from the table compiled in (STAND_IN_UUIDS, a header that
 * tests/support/fake_cuda.py writes). Without the nodes cuInit fails as the
 * driver's does (CUDA_ERROR_NO_DEVICE). Device memory is the process's own.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include STAND_IN_UUIDS /* static const char *const stand_in_uuids[]: minor number -> "GPU-…" */

#define EXPORT __attribute__((visibility("default")))
enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    NO_DEVICE = 100,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
};
#define MAX_DEVICES 64
typedef unsigned long long CUdeviceptr;
typedef struct {
    unsigned char bytes[16];
} CUuuid;

static int minors[MAX_DEVICES];
static int count = -1; /* -1 until cuInit */
static int context_token;

static int is_char(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

static int by_number(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

EXPORT int cuInit(unsigned int flags) {
    if (flags != 0) {
        return INVALID_VALUE;
    }
    count = 0;
    if (!is_char("/dev/nvidiactl")) {
        return NO_DEVICE;
    }
    DIR *dev = opendir("/dev");
    if (dev == NULL) {
        return NO_DEVICE;
    }
    struct dirent *entry;
    int known = (int)(sizeof stand_in_uuids / sizeof stand_in_uuids[0]);
    while ((entry = readdir(dev)) != NULL && count < MAX_DEVICES) {
        int minor;
        char rest;
        char path[300];
        if (sscanf(entry->d_name, "nvidia%d%c", &minor, &rest) != 1 || minor < 0 || minor >= known) {
            continue;
        }
        snprintf(path, sizeof path, "/dev/%s", entry->d_name);
        if (is_char(path)) {
            minors[count++] = minor;
        }
    }
    closedir(dev);
    qsort(minors, (size_t)count, sizeof minors[0], by_number);
    return count ? SUCCESS : NO_DEVICE;
}

EXPORT int cuDriverGetVersion(int *version) {
    *version = 12040;
    return SUCCESS;
}

EXPORT int cuDeviceGetCount(int *out) {
    if (count < 0) {
        return NOT_INITIALIZED;
    }
    *out = count;
    return SUCCESS;
}

EXPORT int cuDeviceGet(int *device, int ordinal) {
    if (count < 0) {
        return NOT_INITIALIZED;
    }
    if (ordinal < 0 || ordinal >= count) {
        return INVALID_DEVICE;
    }
    *device = ordinal;
    return SUCCESS;
}

static int valid(int device) { return count > 0 && device >= 0 && device < count; }

EXPORT int cuDeviceGetName(char *name, int length, int device) {
    if (!valid(device)) {
        return INVALID_DEVICE;
    }
    snprintf(name, (size_t)length, "NVIDIA H100 80GB HBM3 (stand-in)");
    return SUCCESS;
}

EXPORT int cuDeviceGetUuid(CUuuid *uuid, int device) {
    if (!valid(device)) {
        return INVALID_DEVICE;
    }
    const char *text = stand_in_uuids[minors[device]] + 4; /* past "GPU-" */
    for (int i = 0; i < 16; i++) {
        while (*text == '-') {
            text++;
        }
        unsigned int byte;
        if (sscanf(text, "%2x", &byte) != 1) {
            return INVALID_VALUE;
        }
        uuid->bytes[i] = (unsigned char)byte;
        text += 2;
    }
    return SUCCESS;
}

EXPORT int cuDeviceTotalMem_v2(size_t *bytes, int device) {
    if (!valid(device)) {
        return INVALID_DEVICE;
    }
    *bytes = (size_t)80 << 30;
    return SUCCESS;
}

EXPORT int cuDevicePrimaryCtxRetain(void **context, int device) {
    if (!valid(device)) {
        return INVALID_DEVICE;
    }
    *context = &context_token;
    return SUCCESS;
}

EXPORT int cuDevicePrimaryCtxRelease(int device) { return valid(device) ? SUCCESS : INVALID_DEVICE; }

EXPORT int cuCtxSetCurrent(void *context) { return context == &context_token ? SUCCESS : INVALID_CONTEXT; }

EXPORT int cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes) {
    void *memory = malloc(bytes);
    if (memory == NULL) {
        return OUT_OF_MEMORY;
    }
    *pointer = (CUdeviceptr)(size_t)memory;
    return SUCCESS;
}

EXPORT int cuMemFree_v2(CUdeviceptr pointer) {
    free((void *)(size_t)pointer);
    return SUCCESS;
}

EXPORT int cuMemcpyHtoD_v2(CUdeviceptr to, const void *from, size_t bytes) {
    memcpy((void *)(size_t)to, from, bytes);
    return SUCCESS;
}

EXPORT int cuMemcpyDtoH_v2(void *to, CUdeviceptr from, size_t bytes) {
    memcpy(to, (const void *)(size_t)from, bytes);
    return SUCCESS;
}

EXPORT int cuGetErrorName(int error, const char **name) {
    switch (error) {
    case SUCCESS: *name = "CUDA_SUCCESS"; return SUCCESS;
    case INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return SUCCESS;
    case OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return SUCCESS;
    case NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; return SUCCESS;
    case NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; return SUCCESS;
    case INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; return SUCCESS;
    case INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; return SUCCESS;
    default: *name = NULL; return INVALID_VALUE;
    }
}
