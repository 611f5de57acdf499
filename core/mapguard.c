/* mapguard.c - the mapped-region fault guard (file.h).
 *
 * A read-only map of a file reads the file as it is now: when another
 * program truncates it in place, a read past the new end raises SIGBUS,
 * which would end the process (a server with all its clients). Every map
 * of sfw_map_open is registered here; the first one installs a SIGBUS
 * handler (chained to the one installed before it). For a fault inside a
 * registered map the handler maps anonymous zero pages over the map from
 * the faulting page to its end (MAP_FIXED: the read is retried and sees
 * zeros, the program goes on) and records the file; sfw_map_check then
 * reports it, and keeps reporting it: what the process computed from that
 * file is suspect until it is restarted. A fault anywhere else goes to the
 * handler before ours, or ends the process by SIGBUS as it would have.
 * A system call given bytes of such a map (write(2) from it) gets EFAULT
 * instead of a fault; sfwi_map_guard_efault records that the same way
 * (sfw_atomic_write asks it).
 *
 * The handler touches only atomics, a static table and the mmap system
 * call (not on POSIX's async-signal-safe list, but a plain system call on
 * Linux; fault-recovering runtimes use it the same way). */
#include "file.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GUARD_SLOTS 1024 /* maps guarded at once; more are mapped unguarded */
#define GUARD_PATH 512

struct slot {
	_Atomic uintptr_t start; /* 0: free */
	_Atomic uintptr_t end;	 /* page-rounded */
	char path[GUARD_PATH];
};

static struct slot slots[GUARD_SLOTS];
static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static struct sigaction prev_bus;
static uintptr_t page_size;
static atomic_int installed;
static atomic_int nfaults;
static atomic_int fault_state; /* 0 none, 1 being written, 2 fault_path set */
static char fault_path[GUARD_PATH];

static void record(int i)
{
	int none = 0;
	if (atomic_compare_exchange_strong(&fault_state, &none, 1)) {
		size_t k = 0;
		for (; k + 1 < GUARD_PATH && slots[i].path[k]; k++)
			fault_path[k] = slots[i].path[k];
		fault_path[k] = 0;
		atomic_store(&fault_state, 2);
	}
	atomic_fetch_add(&nfaults, 1);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	int saved = errno;
	uintptr_t a = (uintptr_t)si->si_addr;
	if (si->si_code > 0) { /* a fault, not a signal someone sent */
		for (int i = 0; i < GUARD_SLOTS; i++) {
			uintptr_t s = atomic_load(&slots[i].start), e = atomic_load(&slots[i].end);
			if (s == 0 || a < s || a >= e)
				continue;
			uintptr_t pg = a & ~(page_size - 1);
			void *p = mmap((void *)pg, e - pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
			if (p == MAP_FAILED)
				break;
			record(i);
			errno = saved;
			return;
		}
	}
	if ((prev_bus.sa_flags & SA_SIGINFO) && prev_bus.sa_sigaction) {
		prev_bus.sa_sigaction(sig, si, uc);
	} else if (!(prev_bus.sa_flags & SA_SIGINFO) && prev_bus.sa_handler != SIG_DFL &&
		   prev_bus.sa_handler != SIG_IGN) {
		prev_bus.sa_handler(sig);
	} else {
		/* the default: a fault repeats when this returns and then ends
		 * the process; a sent signal is raised again (blocked until the
		 * handler returns) */
		struct sigaction dfl;
		memset(&dfl, 0, sizeof(dfl));
		dfl.sa_handler = SIG_DFL;
		sigemptyset(&dfl.sa_mask);
		sigaction(SIGBUS, &dfl, NULL);
		if (si->si_code <= 0)
			raise(SIGBUS);
	}
	errno = saved;
}

static void install(void)
{
	long pg = sysconf(_SC_PAGESIZE);
	page_size = pg > 0 ? (uintptr_t)pg : 4096;
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &prev_bus) == 0)
		atomic_store(&installed, 1);
}

void sfwi_map_guard_add(const void *p, uint64_t size, const char *path)
{
	if (!p || size == 0)
		return;
	pthread_once(&install_once, install);
	if (!atomic_load(&installed))
		return;
	uintptr_t s = (uintptr_t)p, e = (s + (uintptr_t)size + page_size - 1) & ~(page_size - 1);
	pthread_mutex_lock(&slots_mu);
	for (int i = 0; i < GUARD_SLOTS; i++) {
		if (atomic_load(&slots[i].start) != 0)
			continue;
		snprintf(slots[i].path, sizeof(slots[i].path), "%s", path);
		atomic_store(&slots[i].end, e);
		atomic_store(&slots[i].start, s); /* last: the handler reads start first */
		break;
	}
	pthread_mutex_unlock(&slots_mu);
}

void sfwi_map_guard_remove(const void *p)
{
	if (!p || !atomic_load(&installed))
		return;
	pthread_mutex_lock(&slots_mu);
	for (int i = 0; i < GUARD_SLOTS; i++)
		if (atomic_load(&slots[i].start) == (uintptr_t)p) {
			atomic_store(&slots[i].start, 0);
			break;
		}
	pthread_mutex_unlock(&slots_mu);
}

int sfwi_map_guard_efault(const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p;
	if (!p || !atomic_load(&installed))
		return 0;
	int found = 0;
	pthread_mutex_lock(&slots_mu);
	for (int i = 0; i < GUARD_SLOTS && !found; i++) {
		uintptr_t s = atomic_load(&slots[i].start), e = atomic_load(&slots[i].end);
		if (s != 0 && a >= s && a < e && n <= e - a) {
			record(i);
			found = 1;
		}
	}
	pthread_mutex_unlock(&slots_mu);
	return found;
}

int sfw_map_faults(void)
{
	return atomic_load(&nfaults);
}

enum sfw_status sfw_map_check(struct sfw_err *err)
{
	if (atomic_load(&nfaults) == 0)
		return SFW_OK;
	const char *path = atomic_load(&fault_state) == 2 ? fault_path : "a mapped file";
	return sfw_fail(err, SFW_E_IO,
			"'%s' was truncated while mapped (another program changed it): what was computed from it "
			"is wrong; restore the file and restart",
			path);
}
