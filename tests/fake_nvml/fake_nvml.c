/*
 * fake_nvml.c - a stand-in for NVIDIA's libnvidia-ml.so.1 (NVML), for tests.
 *
 * Why it exists: the agent learns about its GPUs through pynvml, which
 * dlopen()s "libnvidia-ml.so.1" and looks every function up by its C symbol
 * name.  This library exports those symbols with the same C signatures and
 * struct layouts, and answers from a small text file instead of a GPU, so the
 * real pynvml code path can be tested on machines without a GPU (CI, laptops).
 * It is never shipped and never installed system-wide.
 *
 * Build:  scripts/build-fake-nvml.sh [OUTDIR]
 *         (gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -> OUTDIR/libnvidia-ml.so.1)
 * Use:    LD_LIBRARY_PATH=OUTDIR FAKE_NVML_CONFIG=/path/to/config  <process using pynvml>
 *         or, in-process, ctypes.CDLL("OUTDIR/libnvidia-ml.so.1", mode=RTLD_GLOBAL)
 *         before pynvml's first nvmlInit(): the soname makes pynvml's later
 *         CDLL("libnvidia-ml.so.1") return this same, already loaded object.
 *
 * The config is read afresh by every nvmlInit / nvmlInit_v2 / nvmlInitWithFlags:
 *   FAKE_NVML_CONFIG unset          -> NVML_ERROR_DRIVER_NOT_LOADED (as on a host without a driver)
 *   file unreadable or malformed    -> NVML_ERROR_UNKNOWN, and one line on stderr saying why
 * Every other function returns NVML_ERROR_UNINITIALIZED until init succeeded;
 * nvmlShutdown balances init (reference count).
 *
 * Config format: one directive per line; '#' starts a comment (at the start of
 * a line, or after a blank).  Numbers are decimal, or hex with a 0x prefix.
 *
 *   driver 550.54.15                 nvmlSystemGetDriverVersion (NVML version is "<cuda major>.<driver>")
 *   cuda 12040                       nvmlSystemGetCudaDriverVersion[_v2]
 *   gpus 8                           nvmlDeviceGetCount_v2 (default 0, at most FAKE_NVML_MAX_GPUS)
 *   gpu <index> <key> <value...>     one property of GPU <index> (index < gpus)
 *   fail <function> <ERROR>          <function> returns NVML_ERROR_<ERROR> (all GPUs)
 *   gpu <index> fail <function> <ERROR>   the same, for one GPU only (wins over a global one)
 *
 * GPU keys (unset keys keep the defaults of an idle H100 SXM, see gpu_defaults()):
 *   name <rest of line>   uuid <GPU-...>   serial <digits>   bus_id <dddddddd:bb:dd.f>
 *   pci_device_id <0x233010DE>   pci_subsystem_id <0x16C110DE>
 *   memory_total / memory_used / memory_reserved <bytes>
 *       nvmlDeviceGetMemoryInfo_v2: total, reserved, used, free = total - reserved - used;
 *       nvmlDeviceGetMemoryInfo (v1) counts reserved as used, like the real driver.
 *   bus_width <bits>   max_mem_clock / max_graphics_clock / max_sm_clock / max_video_clock <MHz>
 *   pcie_gen_curr  pcie_gen_max  pcie_width_curr  pcie_width_max
 *   nvlink_up <n>         links 0..n-1 report NVML_FEATURE_ENABLED, the others DISABLED;
 *                         link >= 18 is NVML_ERROR_INVALID_ARGUMENT
 *   cc <major.minor>      e.g. 9.0
 *   mig <current> <pending>   ecc <current> <pending>      (0 or 1 each)
 *   ecc_uncorrected <count>   nvmlDeviceGetTotalEccErrors(UNCORRECTED, any counter); CORRECTED is 0
 *   power_limit / power_usage <mW>   (power_limit also answers nvmlDeviceGetEnforcedPowerLimit)
 *   util_gpu / util_mem <percent>    temperature <C>
 *
 * <function> is an exported symbol name below, e.g. nvmlDeviceGetMigMode; a name
 * without a _vN suffix also covers its versioned symbols (nvmlDeviceGetMemoryInfo
 * covers nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetCount covers nvmlDeviceGetCount_v2),
 * and any of nvmlInit, nvmlInit_v2, nvmlInitWithFlags fails all three.  <ERROR> is
 * an NVML_ERROR_* name with or without that prefix (NOT_SUPPORTED, FUNCTION_NOT_FOUND,
 * NO_PERMISSION, GPU_IS_LOST, UNKNOWN, ...), or its number.
 *
 * Extension for tests (not in the real library): fakeNvmlConfigPath() returns
 * the config file of the last successful init, so a test can tell it got the fake.
 *
 * Events (nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2):
 * a test appends lines "<gpu index> <event type number> <event data>" to the
 * file FAKE_NVML_EVENTS names (e.g. "1 8 79": GPU 1, XidCriticalError, Xid
 * 79). A set sees the lines written after its creation, for the devices and
 * types registered in it; nvmlEventSetWait_v2 polls the file every 10 ms up to
 * its timeout, then answers NVML_ERROR_TIMEOUT, as the driver does.
 */

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NVML_API __attribute__((visibility("default")))

#define FAKE_NVML_MAX_GPUS 64
#define FAKE_NVML_MAX_FAILS 256
#define FAKE_NVML_NVLINK_LINKS 18 /* links per GPU on H100 SXM */

/* ---- the parts of nvml.h this library needs (values as in pynvml.py) ---- */

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

typedef enum { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 } nvmlEnableState_t;
typedef enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 } nvmlClockType_t;
typedef enum { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 } nvmlMemoryErrorType_t;
typedef enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 } nvmlEccCounterType_t;
typedef enum { NVML_TEMPERATURE_GPU = 0 } nvmlTemperatureSensors_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version; /* must be nvmlMemory_v2 */
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* NVML_STRUCT_VERSION(Memory, 2) = sizeof | 2 << 24; pynvml: nvmlMemory_v2 = 0x02000028 */
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
_Static_assert(sizeof(nvmlMemory_v2_t) == 0x28, "c_nvmlMemory_v2_t is 40 bytes in pynvml");

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16

typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE]; /* "0000:18:00.0" */
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;    /* device id << 16 | vendor id */
    unsigned int pciSubSystemId; /* subsystem id << 16 | subsystem vendor id */
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE]; /* "00000000:18:00.0" */
} nvmlPciInfo_t;
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout as in pynvml");

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* ---- state ---- */

struct fake_gpu {
    unsigned int index;
    char name[96];   /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
    char uuid[96];   /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */
    char serial[30]; /* NVML_DEVICE_SERIAL_BUFFER_SIZE */
    char bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned int pci_domain, pci_bus, pci_device;
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned long long memory_total, memory_used, memory_reserved;
    unsigned int bus_width;
    unsigned int max_mem_clock, max_graphics_clock, max_sm_clock, max_video_clock;
    unsigned int pcie_gen_curr, pcie_gen_max, pcie_width_curr, pcie_width_max;
    unsigned int nvlink_up;
    int cc[2];          /* major, minor */
    unsigned int mig[2]; /* current, pending */
    unsigned int ecc[2]; /* current, pending */
    unsigned long long ecc_uncorrected;
    unsigned int power_limit, power_usage;
    unsigned int util_gpu, util_mem;
    unsigned int temperature;
};

struct fail_rule {
    char function[64];
    int gpu; /* -1: every GPU / a system function */
    nvmlReturn_t code;
};

struct config {
    char path[4096];
    char driver[80];
    int cuda;
    unsigned int count;
    struct fake_gpu gpus[FAKE_NVML_MAX_GPUS];
    struct fail_rule fails[FAKE_NVML_MAX_FAILS];
    unsigned int nfails;
};

/* g_cfg is what the API answers from; device handles point into g_cfg.gpus
 * and stay valid across re-inits (they are checked against the current count). */
static struct config g_cfg;
static struct config g_parsed; /* scratch for parsing; installed only when valid */
static unsigned int g_refcount;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- errors ---- */

static const struct {
    int code;
    const char *name;
    const char *text;
} k_errors[] = {
    {0, "SUCCESS", "Success"},
    {1, "UNINITIALIZED", "Uninitialized"},
    {2, "INVALID_ARGUMENT", "Invalid Argument"},
    {3, "NOT_SUPPORTED", "Not Supported"},
    {4, "NO_PERMISSION", "Insufficient Permissions"},
    {5, "ALREADY_INITIALIZED", "Already Initialized"},
    {6, "NOT_FOUND", "Not Found"},
    {7, "INSUFFICIENT_SIZE", "Insufficient Size"},
    {8, "INSUFFICIENT_POWER", "Insufficient External Power"},
    {9, "DRIVER_NOT_LOADED", "Driver Not Loaded"},
    {10, "TIMEOUT", "Timeout"},
    {11, "IRQ_ISSUE", "Interrupt Request Issue"},
    {12, "LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"},
    {13, "FUNCTION_NOT_FOUND", "Function Not Found"},
    {14, "CORRUPTED_INFOROM", "Corrupted infoROM"},
    {15, "GPU_IS_LOST", "GPU is lost"},
    {16, "RESET_REQUIRED", "GPU requires restart"},
    {17, "OPERATING_SYSTEM", "The operating system has blocked the request."},
    {18, "LIB_RM_VERSION_MISMATCH", "RM has detected an NVML/RM version mismatch."},
    {19, "IN_USE", "In use by another client"},
    {20, "MEMORY", "Insufficient Memory"},
    {21, "NO_DATA", "No data"},
    {22, "VGPU_ECC_NOT_SUPPORTED", "vGPU ECC Not Supported"},
    {23, "INSUFFICIENT_RESOURCES", "Insufficient Resources"},
    {24, "FREQ_NOT_SUPPORTED", "Frequency Not Supported"},
    {25, "ARGUMENT_VERSION_MISMATCH", "Argument Version Mismatch"},
    {26, "DEPRECATED", "Deprecated"},
    {27, "NOT_READY", "Not Ready"},
    {28, "GPU_NOT_FOUND", "GPU Not Found"},
    {29, "INVALID_STATE", "Invalid State"},
    {30, "RESET_TYPE_NOT_SUPPORTED", "Reset Type Not Supported"},
    {999, "UNKNOWN", "Unknown Error"},
};

/* ---- exported functions, for validating `fail` lines ---- */

static const struct {
    const char *name;
    int per_gpu; /* takes a device (or, for GetHandleByIndex, a GPU index) */
} k_functions[] = {
    {"nvmlInitWithFlags", 0},
    {"nvmlInit", 0},
    {"nvmlInit_v2", 0},
    {"nvmlShutdown", 0},
    {"nvmlSystemGetDriverVersion", 0},
    {"nvmlSystemGetNVMLVersion", 0},
    {"nvmlSystemGetCudaDriverVersion", 0},
    {"nvmlSystemGetCudaDriverVersion_v2", 0},
    {"nvmlDeviceGetCount", 0},
    {"nvmlDeviceGetCount_v2", 0},
    {"nvmlDeviceGetHandleByIndex", 1},
    {"nvmlDeviceGetHandleByIndex_v2", 1},
    {"nvmlDeviceGetName", 1},
    {"nvmlDeviceGetUUID", 1},
    {"nvmlDeviceGetSerial", 1},
    {"nvmlDeviceGetPciInfo_v3", 1},
    {"nvmlDeviceGetMemoryInfo", 1},
    {"nvmlDeviceGetMemoryInfo_v2", 1},
    {"nvmlDeviceGetMemoryBusWidth", 1},
    {"nvmlDeviceGetMaxClockInfo", 1},
    {"nvmlDeviceGetCurrPcieLinkGeneration", 1},
    {"nvmlDeviceGetMaxPcieLinkGeneration", 1},
    {"nvmlDeviceGetCurrPcieLinkWidth", 1},
    {"nvmlDeviceGetMaxPcieLinkWidth", 1},
    {"nvmlDeviceGetNvLinkState", 1},
    {"nvmlDeviceGetCudaComputeCapability", 1},
    {"nvmlDeviceGetMigMode", 1},
    {"nvmlDeviceGetEccMode", 1},
    {"nvmlDeviceGetTotalEccErrors", 1},
    {"nvmlDeviceGetPowerManagementLimit", 1},
    {"nvmlDeviceGetEnforcedPowerLimit", 1},
    {"nvmlDeviceGetPowerUsage", 1},
    {"nvmlDeviceGetUtilizationRates", 1},
    {"nvmlDeviceGetTemperature", 1},
    {"nvmlDeviceGetIndex", 1},
    {"nvmlDeviceGetMinorNumber", 1},
};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Length of `symbol` without a trailing "_v<digits>". */
static size_t base_len(const char *symbol)
{
    size_t n = strlen(symbol), i = n;
    while (i > 0 && symbol[i - 1] >= '0' && symbol[i - 1] <= '9')
        i--;
    if (i < n && i >= 2 && symbol[i - 1] == 'v' && symbol[i - 2] == '_')
        return i - 2;
    return n;
}

/* Does a `fail` rule naming `rule` apply to the exported `symbol`? */
static int rule_names(const char *rule, const char *symbol)
{
    if (strcmp(rule, symbol) == 0)
        return 1;
    size_t n = base_len(symbol);
    return n != strlen(symbol) && strlen(rule) == n && strncmp(rule, symbol, n) == 0;
}

static int is_init_symbol(const char *s)
{
    return !strcmp(s, "nvmlInit") || !strcmp(s, "nvmlInit_v2") || !strcmp(s, "nvmlInitWithFlags");
}

/* The configured failure for `symbol` on GPU `gpu` (-1: none), or NVML_SUCCESS. */
static nvmlReturn_t configured_failure(const struct config *c, const char *symbol, int gpu)
{
    for (int pass = 0; pass < 2; pass++) { /* a GPU's own rule wins over a global one */
        int want = pass == 0 ? gpu : -1;
        if (pass == 0 && gpu < 0)
            continue;
        for (unsigned int i = 0; i < c->nfails; i++) {
            const struct fail_rule *r = &c->fails[i];
            if (r->gpu != want)
                continue;
            if (rule_names(r->function, symbol) ||
                (is_init_symbol(symbol) && is_init_symbol(r->function)))
                return r->code;
        }
    }
    return NVML_SUCCESS;
}

/* ---- config parsing ---- */

struct parser {
    const char *path;
    unsigned int line;
    char *err;
    size_t errlen;
};

__attribute__((format(printf, 2, 3))) static int parse_error(struct parser *p, const char *fmt, ...);

static int parse_error(struct parser *p, const char *fmt, ...)
{
    int n = snprintf(p->err, p->errlen, "%s:%u: ", p->path, p->line);
    if (n < 0 || (size_t)n >= p->errlen)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* Next blank-separated word of *s (NUL-terminated in place), or NULL. */
static char *next_word(char **s)
{
    char *p = *s;
    while (*p == ' ' || *p == '\t')
        p++;
    if (!*p) {
        *s = p;
        return NULL;
    }
    char *start = p;
    while (*p && *p != ' ' && *p != '\t')
        p++;
    if (*p)
        *p++ = '\0';
    *s = p;
    return start;
}

/* The rest of *s, without leading blanks (trailing ones are already gone). */
static char *rest_of_line(char **s)
{
    char *p = *s;
    while (*p == ' ' || *p == '\t')
        p++;
    *s = p + strlen(p);
    return *p ? p : NULL;
}

static int parse_u64(const char *s, unsigned long long *out)
{
    int base = 10;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
    }
    if (!*s || *s == '-' || *s == '+' || *s == ' ')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

static int parse_u32(const char *s, unsigned int *out)
{
    unsigned long long v;
    if (parse_u64(s, &v) || v > UINT_MAX)
        return -1;
    *out = (unsigned int)v;
    return 0;
}

static int parse_error_code(const char *s, nvmlReturn_t *out)
{
    if (!strncmp(s, "NVML_ERROR_", 11))
        s += 11;
    unsigned int number;
    int numeric = parse_u32(s, &number) == 0;
    for (size_t i = 1; i < COUNT_OF(k_errors); i++) { /* 0 (SUCCESS) is no failure */
        if (numeric ? (unsigned int)k_errors[i].code == number : !strcmp(k_errors[i].name, s)) {
            *out = (nvmlReturn_t)k_errors[i].code;
            return 0;
        }
    }
    return -1;
}

static void gpu_defaults(struct fake_gpu *g, unsigned int index)
{
    memset(g, 0, sizeof *g);
    g->index = index;
    snprintf(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3");
    snprintf(g->uuid, sizeof g->uuid, "GPU-00000000-0000-4000-8000-%012x", index);
    snprintf(g->serial, sizeof g->serial, "16549220%05u", 10000 + index);
    g->pci_domain = 0;
    g->pci_bus = index + 1;
    g->pci_device = 0;
    snprintf(g->bus_id, sizeof g->bus_id, "%08X:%02X:%02X.0", g->pci_domain, g->pci_bus, g->pci_device);
    g->pci_device_id = 0x233010DE;
    g->pci_subsystem_id = 0x16C110DE;
    g->memory_total = 81559ull << 20;
    g->memory_used = 0;
    g->memory_reserved = 0;
    g->bus_width = 5120;
    g->max_mem_clock = 2619;
    g->max_graphics_clock = 1980;
    g->max_sm_clock = 1980;
    g->max_video_clock = 1755;
    g->pcie_gen_curr = g->pcie_gen_max = 5;
    g->pcie_width_curr = g->pcie_width_max = 16;
    g->nvlink_up = FAKE_NVML_NVLINK_LINKS;
    g->cc[0] = 9;
    g->cc[1] = 0;
    g->mig[0] = g->mig[1] = 0;
    g->ecc[0] = g->ecc[1] = 1;
    g->ecc_uncorrected = 0;
    g->power_limit = 700000;
    g->power_usage = 70000;
    g->util_gpu = g->util_mem = 0;
    g->temperature = 30;
}

static int copy_word(struct parser *p, const char *key, char *dst, size_t size, const char *value)
{
    if (strlen(value) >= size)
        return parse_error(p, "%s is longer than %zu characters", key, size - 1);
    memcpy(dst, value, strlen(value) + 1);
    return 0;
}

/* Scalar keys: name, size and where they live in struct fake_gpu. */
static const struct {
    const char *key;
    size_t offset;
    size_t size; /* sizeof(unsigned int) or sizeof(unsigned long long) */
    unsigned long long max;
} k_number_keys[] = {
#define U32(field, max) {#field, offsetof(struct fake_gpu, field), sizeof(unsigned int), max}
#define U64(field) {#field, offsetof(struct fake_gpu, field), sizeof(unsigned long long), ULLONG_MAX}
    U32(pci_device_id, UINT_MAX),
    U32(pci_subsystem_id, UINT_MAX),
    U64(memory_total),
    U64(memory_used),
    U64(memory_reserved),
    U32(bus_width, UINT_MAX),
    U32(max_mem_clock, UINT_MAX),
    U32(max_graphics_clock, UINT_MAX),
    U32(max_sm_clock, UINT_MAX),
    U32(max_video_clock, UINT_MAX),
    U32(pcie_gen_curr, UINT_MAX),
    U32(pcie_gen_max, UINT_MAX),
    U32(pcie_width_curr, UINT_MAX),
    U32(pcie_width_max, UINT_MAX),
    U32(nvlink_up, FAKE_NVML_NVLINK_LINKS),
    U64(ecc_uncorrected),
    U32(power_limit, UINT_MAX),
    U32(power_usage, UINT_MAX),
    U32(util_gpu, 100),
    U32(util_mem, 100),
    U32(temperature, UINT_MAX),
#undef U32
#undef U64
};

static int parse_fail(struct parser *p, struct config *c, char **s, int gpu)
{
    char *function = next_word(s), *error = next_word(s);
    if (!function || !error || next_word(s))
        return parse_error(p, "expected: %sfail <function> <ERROR>", gpu >= 0 ? "gpu <index> " : "");
    int known = 0, per_gpu = 0;
    for (size_t i = 0; i < COUNT_OF(k_functions); i++) {
        if (rule_names(function, k_functions[i].name)) {
            known = 1;
            per_gpu |= k_functions[i].per_gpu;
        }
    }
    if (!known)
        return parse_error(p, "fail: unknown function '%s'", function);
    if (gpu >= 0 && !per_gpu)
        return parse_error(p, "fail: %s is not a per-GPU function; use a global `fail` line", function);
    if (c->nfails == FAKE_NVML_MAX_FAILS)
        return parse_error(p, "more than %d fail lines", FAKE_NVML_MAX_FAILS);
    struct fail_rule *r = &c->fails[c->nfails];
    if (copy_word(p, "function name", r->function, sizeof r->function, function))
        return -1;
    if (parse_error_code(error, &r->code))
        return parse_error(p, "fail: unknown error '%s' (e.g. NOT_SUPPORTED, FUNCTION_NOT_FOUND)", error);
    r->gpu = gpu;
    c->nfails++;
    return 0;
}

static int parse_pair(struct parser *p, const char *key, char **s, unsigned int out[2])
{
    char *a = next_word(s), *b = next_word(s);
    if (!a || !b || next_word(s) || parse_u32(a, &out[0]) || parse_u32(b, &out[1]) || out[0] > 1 || out[1] > 1)
        return parse_error(p, "%s: expected <current> <pending>, each 0 or 1", key);
    return 0;
}

static int parse_gpu_line(struct parser *p, struct config *c, char **s, unsigned int *index_out)
{
    char *index_word = next_word(s), *key = next_word(s);
    unsigned int index;
    if (!index_word || parse_u32(index_word, &index))
        return parse_error(p, "expected: gpu <index> <key> <value...>");
    *index_out = index;
    if (index >= FAKE_NVML_MAX_GPUS)
        return parse_error(p, "gpu index %u: at most %d GPUs", index, FAKE_NVML_MAX_GPUS);
    if (!key)
        return parse_error(p, "gpu %u: missing key", index);
    struct fake_gpu *g = &c->gpus[index];

    if (!strcmp(key, "fail"))
        return parse_fail(p, c, s, (int)index);
    if (!strcmp(key, "mig"))
        return parse_pair(p, key, s, g->mig);
    if (!strcmp(key, "ecc"))
        return parse_pair(p, key, s, g->ecc);
    if (!strcmp(key, "name")) {
        char *name = rest_of_line(s);
        if (!name)
            return parse_error(p, "name: missing value");
        return copy_word(p, key, g->name, sizeof g->name, name);
    }

    char *value = next_word(s);
    if (!value || next_word(s))
        return parse_error(p, "gpu %u %s: expected exactly one value", index, key);
    if (!strcmp(key, "uuid"))
        return copy_word(p, key, g->uuid, sizeof g->uuid, value);
    if (!strcmp(key, "serial"))
        return copy_word(p, key, g->serial, sizeof g->serial, value);
    if (!strcmp(key, "bus_id")) {
        unsigned int domain, bus, device, function;
        int used = -1;
        if (sscanf(value, "%8x:%2x:%2x.%1x%n", &domain, &bus, &device, &function, &used) != 4 ||
            used != (int)strlen(value) || device > 0x1f || function > 7)
            return parse_error(p, "bus_id: expected DDDDDDDD:BB:DD.F, got '%s'", value);
        g->pci_domain = domain;
        g->pci_bus = bus;
        g->pci_device = device;
        return copy_word(p, key, g->bus_id, sizeof g->bus_id, value);
    }
    if (!strcmp(key, "cc")) {
        int major, minor, used = -1;
        if (sscanf(value, "%d.%d%n", &major, &minor, &used) != 2 || used != (int)strlen(value) || major < 0 ||
            minor < 0)
            return parse_error(p, "cc: expected <major>.<minor>, got '%s'", value);
        g->cc[0] = major;
        g->cc[1] = minor;
        return 0;
    }
    for (size_t i = 0; i < COUNT_OF(k_number_keys); i++) {
        if (strcmp(key, k_number_keys[i].key))
            continue;
        unsigned long long v;
        if (parse_u64(value, &v) || v > k_number_keys[i].max)
            return parse_error(p, "%s: '%s' is not a number from 0 to %llu", key, value, k_number_keys[i].max);
        char *field = (char *)g + k_number_keys[i].offset;
        if (k_number_keys[i].size == sizeof(unsigned int)) {
            unsigned int v32 = (unsigned int)v;
            memcpy(field, &v32, sizeof v32);
        } else {
            memcpy(field, &v, sizeof v);
        }
        return 0;
    }
    return parse_error(p, "gpu %u: unknown key '%s'", index, key);
}

/* Strips a comment ('#' at the start or after a blank) and trailing blanks. */
static void strip_line(char *line)
{
    for (char *h = strchr(line, '#'); h; h = strchr(h + 1, '#')) {
        if (h == line || h[-1] == ' ' || h[-1] == '\t') {
            *h = '\0';
            break;
        }
    }
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\t' || line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
}

/* Reads `path` into `c`.  Returns 0, or -1 with a reason in err. */
static int parse_config(const char *path, struct config *c, char *err, size_t errlen)
{
    struct parser p = {path, 0, err, errlen};
    memset(c, 0, sizeof *c);
    if (strlen(path) >= sizeof c->path)
        return parse_error(&p, "path too long");
    memcpy(c->path, path, strlen(path) + 1);
    snprintf(c->driver, sizeof c->driver, "550.54.15");
    c->cuda = 12040;
    for (unsigned int i = 0; i < FAKE_NVML_MAX_GPUS; i++)
        gpu_defaults(&c->gpus[i], i);
    unsigned int highest_gpu_line = 0, any_gpu_line = 0, highest_gpu_line_no = 0;

    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char line[4096];
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        p.line++;
        if (!strchr(line, '\n') && !feof(f)) {
            rc = parse_error(&p, "line longer than %zu characters", sizeof line - 2);
            break;
        }
        strip_line(line);
        char *s = line;
        char *directive = next_word(&s);
        if (!directive)
            continue;
        if (!strcmp(directive, "driver")) {
            char *v = next_word(&s);
            if (!v || next_word(&s))
                rc = parse_error(&p, "expected: driver <version>");
            else
                rc = copy_word(&p, "driver", c->driver, sizeof c->driver, v);
        } else if (!strcmp(directive, "cuda")) {
            char *v = next_word(&s);
            unsigned int cuda;
            if (!v || next_word(&s) || parse_u32(v, &cuda) || cuda > INT_MAX)
                rc = parse_error(&p, "expected: cuda <version as a number, e.g. 12040>");
            else
                c->cuda = (int)cuda;
        } else if (!strcmp(directive, "gpus")) {
            char *v = next_word(&s);
            if (!v || next_word(&s) || parse_u32(v, &c->count) || c->count > FAKE_NVML_MAX_GPUS)
                rc = parse_error(&p, "expected: gpus <count from 0 to %d>", FAKE_NVML_MAX_GPUS);
        } else if (!strcmp(directive, "fail")) {
            rc = parse_fail(&p, c, &s, -1);
        } else if (!strcmp(directive, "gpu")) {
            unsigned int index = 0;
            rc = parse_gpu_line(&p, c, &s, &index);
            if (rc == 0 && (!any_gpu_line || index > highest_gpu_line)) {
                highest_gpu_line = index;
                highest_gpu_line_no = p.line;
                any_gpu_line = 1;
            }
        } else {
            rc = parse_error(&p, "unknown directive '%s'", directive);
        }
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
        rc = -1;
    }
    fclose(f);
    if (rc)
        return rc;

    if (any_gpu_line && highest_gpu_line >= c->count) {
        p.line = highest_gpu_line_no;
        return parse_error(&p, "gpu %u configured, but `gpus` is %u", highest_gpu_line, c->count);
    }
    for (unsigned int i = 0; i < c->count; i++) {
        const struct fake_gpu *g = &c->gpus[i];
        if (g->memory_used > g->memory_total || g->memory_reserved > g->memory_total - g->memory_used) {
            snprintf(err, errlen, "%s: gpu %u: memory_used + memory_reserved exceed memory_total", path, i);
            return -1;
        }
    }
    return 0;
}

/* ---- helpers for the API ---- */

static nvmlReturn_t system_entry(const char *symbol)
{
    if (!g_refcount)
        return NVML_ERROR_UNINITIALIZED;
    return configured_failure(&g_cfg, symbol, -1);
}

typedef struct fake_gpu *nvmlDevice_t;

static int valid_handle(nvmlDevice_t device)
{
    uintptr_t p = (uintptr_t)device, base = (uintptr_t)g_cfg.gpus;
    if (p < base || (p - base) % sizeof(struct fake_gpu))
        return 0;
    return (p - base) / sizeof(struct fake_gpu) < g_cfg.count;
}

static nvmlReturn_t device_entry(const char *symbol, nvmlDevice_t device)
{
    if (!g_refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid_handle(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    return configured_failure(&g_cfg, symbol, (int)device->index);
}

/* Every API function starts with one of these: __func__ is the exported symbol. */
#define SYSTEM_ENTRY()                                                                                                 \
    do {                                                                                                               \
        nvmlReturn_t entry_rc_ = system_entry(__func__);                                                               \
        if (entry_rc_ != NVML_SUCCESS)                                                                                 \
            return entry_rc_;                                                                                          \
    } while (0)
#define DEVICE_ENTRY(device)                                                                                           \
    do {                                                                                                               \
        nvmlReturn_t entry_rc_ = device_entry(__func__, device);                                                       \
        if (entry_rc_ != NVML_SUCCESS)                                                                                 \
            return entry_rc_;                                                                                          \
    } while (0)
#define REQUIRE(cond)                                                                                                  \
    do {                                                                                                               \
        if (!(cond))                                                                                                   \
            return NVML_ERROR_INVALID_ARGUMENT;                                                                        \
    } while (0)

static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *src)
{
    REQUIRE(dst);
    size_t n = strlen(src);
    if (length < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

/* ---- init / shutdown ---- */

static nvmlReturn_t init_common(const char *symbol)
{
    const char *path = getenv("FAKE_NVML_CONFIG");
    if (!path || !*path)
        return NVML_ERROR_DRIVER_NOT_LOADED;

    pthread_mutex_lock(&g_lock);
    char err[512];
    nvmlReturn_t rc = NVML_SUCCESS;
    if (parse_config(path, &g_parsed, err, sizeof err)) {
        fprintf(stderr, "fake-nvml: %s\n", err);
        rc = NVML_ERROR_UNKNOWN;
    } else {
        rc = configured_failure(&g_parsed, symbol, -1);
    }
    if (rc == NVML_SUCCESS) {
        g_cfg = g_parsed;
        g_refcount++;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

NVML_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS / NO_ATTACH / FORCE_INIT change nothing here */
    return init_common(__func__);
}

NVML_API nvmlReturn_t nvmlInit_v2(void)
{
    return init_common(__func__);
}

NVML_API nvmlReturn_t nvmlInit(void)
{
    return init_common(__func__);
}

NVML_API nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = system_entry(__func__);
    if (rc == NVML_SUCCESS)
        g_refcount--;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

NVML_API const char *nvmlErrorString(nvmlReturn_t result)
{
    for (size_t i = 0; i < COUNT_OF(k_errors); i++)
        if (k_errors[i].code == (int)result)
            return k_errors[i].text;
    return "Unknown Error";
}

NVML_API const char *fakeNvmlConfigPath(void)
{
    return g_cfg.path;
}

/* ---- system ---- */

NVML_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    SYSTEM_ENTRY();
    return copy_out(version, length, g_cfg.driver);
}

NVML_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    SYSTEM_ENTRY();
    char buf[96];
    snprintf(buf, sizeof buf, "%d.%s", g_cfg.cuda / 1000, g_cfg.driver); /* e.g. "12.550.54.15" */
    return copy_out(version, length, buf);
}

static nvmlReturn_t cuda_version(int *version)
{
    REQUIRE(version);
    *version = g_cfg.cuda;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    SYSTEM_ENTRY();
    return cuda_version(cudaDriverVersion);
}

NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    SYSTEM_ENTRY();
    return cuda_version(cudaDriverVersion);
}

/* ---- enumeration ---- */

static nvmlReturn_t device_count(unsigned int *count)
{
    REQUIRE(count);
    *count = g_cfg.count;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    SYSTEM_ENTRY();
    return device_count(deviceCount);
}

NVML_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    SYSTEM_ENTRY();
    return device_count(deviceCount);
}

static nvmlReturn_t handle_by_index(const char *symbol, unsigned int index, nvmlDevice_t *device)
{
    if (!g_refcount)
        return NVML_ERROR_UNINITIALIZED;
    REQUIRE(device && index < g_cfg.count);
    nvmlReturn_t rc = configured_failure(&g_cfg, symbol, (int)index);
    if (rc != NVML_SUCCESS)
        return rc;
    *device = &g_cfg.gpus[index];
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(__func__, index, device);
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(__func__, index, device);
}

NVML_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    DEVICE_ENTRY(device);
    REQUIRE(index);
    *index = device->index;
    return NVML_SUCCESS;
}

/* The GPU's /dev/nvidia<minor>: here its index, as the driver numbers them on most machines. */
NVML_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
    DEVICE_ENTRY(device);
    REQUIRE(minor);
    *minor = device->index;
    return NVML_SUCCESS;
}

/* ---- identity ---- */

NVML_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    DEVICE_ENTRY(device);
    return copy_out(name, length, device->name);
}

NVML_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    DEVICE_ENTRY(device);
    return copy_out(uuid, length, device->uuid);
}

NVML_API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    DEVICE_ENTRY(device);
    return copy_out(serial, length, device->serial);
}

NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEVICE_ENTRY(device);
    REQUIRE(pci);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", device->pci_domain & 0xffff,
             device->pci_bus & 0xff, device->pci_device & 0xff);
    pci->domain = device->pci_domain;
    pci->bus = device->pci_bus;
    pci->device = device->pci_device;
    pci->pciDeviceId = device->pci_device_id;
    pci->pciSubSystemId = device->pci_subsystem_id;
    memcpy(pci->busId, device->bus_id, sizeof pci->busId);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    DEVICE_ENTRY(device);
    REQUIRE(major && minor);
    *major = device->cc[0];
    *minor = device->cc[1];
    return NVML_SUCCESS;
}

/* ---- memory ---- */

NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    DEVICE_ENTRY(device);
    REQUIRE(memory);
    memory->total = device->memory_total;
    memory->used = device->memory_used + device->memory_reserved; /* v1 counts reserved as used */
    memory->free = device->memory_total - memory->used;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    DEVICE_ENTRY(device);
    REQUIRE(memory);
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = device->memory_total;
    memory->reserved = device->memory_reserved;
    memory->used = device->memory_used;
    memory->free = device->memory_total - device->memory_reserved - device->memory_used;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetMemoryBusWidth(nvmlDevice_t device, unsigned int *busWidth)
{
    DEVICE_ENTRY(device);
    REQUIRE(busWidth);
    *busWidth = device->bus_width;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    DEVICE_ENTRY(device);
    REQUIRE(clock);
    switch (type) {
    case NVML_CLOCK_GRAPHICS: *clock = device->max_graphics_clock; break;
    case NVML_CLOCK_SM: *clock = device->max_sm_clock; break;
    case NVML_CLOCK_MEM: *clock = device->max_mem_clock; break;
    case NVML_CLOCK_VIDEO: *clock = device->max_video_clock; break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

/* ---- interconnect ---- */

static nvmlReturn_t out_u32(unsigned int *out, unsigned int value)
{
    REQUIRE(out);
    *out = value;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen)
{
    DEVICE_ENTRY(device);
    return out_u32(currLinkGen, device->pcie_gen_curr);
}

NVML_API nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen)
{
    DEVICE_ENTRY(device);
    return out_u32(maxLinkGen, device->pcie_gen_max);
}

NVML_API nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth)
{
    DEVICE_ENTRY(device);
    return out_u32(currLinkWidth, device->pcie_width_curr);
}

NVML_API nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth)
{
    DEVICE_ENTRY(device);
    return out_u32(maxLinkWidth, device->pcie_width_max);
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    DEVICE_ENTRY(device);
    REQUIRE(isActive && link < FAKE_NVML_NVLINK_LINKS);
    *isActive = link < device->nvlink_up ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ---- modes and health ---- */

NVML_API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    DEVICE_ENTRY(device);
    REQUIRE(currentMode && pendingMode);
    *currentMode = device->mig[0];
    *pendingMode = device->mig[1];
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending)
{
    DEVICE_ENTRY(device);
    REQUIRE(current && pending);
    *current = device->ecc[0] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    *pending = device->ecc[1] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                  nvmlEccCounterType_t counterType, unsigned long long *eccCounts)
{
    DEVICE_ENTRY(device);
    REQUIRE(eccCounts);
    REQUIRE(counterType == NVML_VOLATILE_ECC || counterType == NVML_AGGREGATE_ECC);
    switch (errorType) {
    case NVML_MEMORY_ERROR_TYPE_CORRECTED: *eccCounts = 0; break;
    case NVML_MEMORY_ERROR_TYPE_UNCORRECTED: *eccCounts = device->ecc_uncorrected; break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                               unsigned int *temp)
{
    DEVICE_ENTRY(device);
    REQUIRE(sensorType == NVML_TEMPERATURE_GPU);
    return out_u32(temp, device->temperature);
}

/* ---- power and load ---- */

NVML_API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    DEVICE_ENTRY(device);
    return out_u32(limit, device->power_limit);
}

NVML_API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    DEVICE_ENTRY(device);
    return out_u32(limit, device->power_limit);
}

NVML_API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    DEVICE_ENTRY(device);
    return out_u32(power, device->power_usage);
}

NVML_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    DEVICE_ENTRY(device);
    REQUIRE(utilization);
    utilization->gpu = device->util_gpu;
    utilization->memory = device->util_mem;
    return NVML_SUCCESS;
}

/* ---- events ---- */

#define FAKE_NVML_EVENT_TYPES 0xFF9FULL /* nvmlEventTypeAll */

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

struct fake_event_set {
    long offset; /* of the events file: lines before it were written before the set */
    unsigned long long registered[FAKE_NVML_MAX_GPUS];
};
typedef struct fake_event_set *nvmlEventSet_t;

static long events_file_size(void)
{
    const char *path = getenv("FAKE_NVML_EVENTS");
    FILE *f = path ? fopen(path, "r") : NULL;
    long size = 0;
    if (f) {
        if (fseek(f, 0, SEEK_END) == 0)
            size = ftell(f);
        fclose(f);
    }
    return size < 0 ? 0 : size;
}

NVML_API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    SYSTEM_ENTRY();
    REQUIRE(set);
    *set = calloc(1, sizeof(**set));
    if (!*set)
        return NVML_ERROR_UNKNOWN;
    (*set)->offset = events_file_size();
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    DEVICE_ENTRY(device);
    REQUIRE(eventTypes);
    *eventTypes = FAKE_NVML_EVENT_TYPES;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    DEVICE_ENTRY(device);
    REQUIRE(set && (eventTypes & ~FAKE_NVML_EVENT_TYPES) == 0);
    set->registered[device->index] |= eventTypes;
    return NVML_SUCCESS;
}

/* The next event of the file after the set's offset that the set registered; 1 if one was found. */
static int next_event(nvmlEventSet_t set, nvmlEventData_t *data)
{
    const char *path = getenv("FAKE_NVML_EVENTS");
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[256];
    int found = 0;
    if (!f)
        return 0;
    if (fseek(f, set->offset, SEEK_SET) != 0) {
        fclose(f);
        return 0;
    }
    while (!found && fgets(line, sizeof(line), f)) {
        size_t len = strlen(line);
        unsigned int gpu;
        unsigned long long type, value;
        if (!len || line[len - 1] != '\n')
            break; /* a line still being written: read it next time */
        set->offset += (long)len;
        if (sscanf(line, "%u %llu %llu", &gpu, &type, &value) != 3 || gpu >= g_cfg.count)
            continue;
        if (set->registered[gpu] & type) {
            memset(data, 0, sizeof(*data));
            data->device = &g_cfg.gpus[gpu];
            data->eventType = type;
            data->eventData = value;
            found = 1;
        }
    }
    fclose(f);
    return found;
}

NVML_API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    SYSTEM_ENTRY();
    REQUIRE(set && data);
    for (unsigned int waited = 0;; waited += 10) {
        pthread_mutex_lock(&g_lock);
        int found = next_event(set, data);
        pthread_mutex_unlock(&g_lock);
        if (found)
            return NVML_SUCCESS;
        if (waited >= timeoutms)
            return NVML_ERROR_TIMEOUT;
        struct timespec step = {0, 10 * 1000 * 1000};
        nanosleep(&step, NULL);
    }
}

NVML_API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

NVML_API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    SYSTEM_ENTRY();
    free(set);
    return NVML_SUCCESS;
}
