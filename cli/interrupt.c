/* cli/interrupt.c - SIGINT/SIGTERM for every command: temporary files are
 * removed, partial downloads kept, and the process ends by the signal (the
 * shell sees 130 or 143). See cli.h. */
#include "cli.h"

#include "file.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_sig;    /* the first signal caught */
static volatile sig_atomic_t g_polled; /* the command polls g_cancel itself */
static volatile sig_atomic_t g_cancel; /* set for a polling command */
static volatile sig_atomic_t g_abort;  /* makes the atomic writers fail */

static void on_signal(int sig)
{
	if (!g_sig)
		g_sig = sig;
	/* a polling command stops at its next check; a second signal ends it
	 * at once unless a temporary file is being written */
	if (g_polled && !g_cancel) {
		g_cancel = 1;
		return;
	}
	if (sfw_atomic_quiesce()) {
		/* nothing to clean up: end now, by the signal, in the words
		 * cli_interrupt_finish uses (async-signal-safe: fixed strings) */
		static const char by_int[] = "salafw: interrupted by SIGINT; temporary files removed";
		static const char by_term[] = "salafw: interrupted by SIGTERM; temporary files removed";
		static const char kept[] = ", partial downloads kept (run the same command again to resume)";
		const char *m = sig == SIGINT ? by_int : by_term;
		ssize_t w = write(2, m, sig == SIGINT ? sizeof(by_int) - 1 : sizeof(by_term) - 1);
		if (g_polled)
			w = write(2, kept, sizeof(kept) - 1);
		w = write(2, "\n", 1);
		(void)w;
		signal(sig, SIG_DFL);
		raise(sig);
		return;
	}
	g_abort = 1;
	g_cancel = 1;
}

void cli_interrupt_install(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, SIGINT);
	sigaddset(&sa.sa_mask, SIGTERM);
	sa.sa_flags = SA_RESTART;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sfw_atomic_set_cancel(&g_abort);
}

volatile sig_atomic_t *cli_interrupt_polled(void)
{
	g_polled = 1;
	return &g_cancel;
}

int cli_interrupt_take(void)
{
	int sig = g_sig;
	g_sig = 0;
	g_cancel = 0;
	return sig;
}

void cli_interrupt_finish(void)
{
	int sig = g_sig;
	if (!sig)
		return;
	sfw_atomic_quiesce(); /* a second signal from here on ends the process at once */
	fflush(stdout);
	fprintf(stderr, "salafw: interrupted by %s; temporary files removed%s\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
		g_polled ? ", partial downloads kept (run the same command again to resume)" : "");
	fflush(stderr);
	signal(sig, SIG_DFL);
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, sig);
	sigprocmask(SIG_UNBLOCK, &set, NULL);
	raise(sig);
	_exit(128 + sig); /* not reached */
}
