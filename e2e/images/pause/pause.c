/*
 * csiops pause: the process that holds a pod sandbox's namespaces open in the
 * e2e test bed's containerd (its CRI `sandbox_image`). It does nothing but
 * wait: SIGINT/SIGTERM end it with status 0, and as PID 1 of the sandbox it
 * reaps any child re-parented to it so no zombie is left behind.
 *
 * Built static with musl: `musl-gcc -static -Os -s -o pause pause.c`
 * (e2e/images/build.sh does this).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PAUSE_VERSION
#define PAUSE_VERSION "dev"
#endif

static void on_term(int sig)
{
	(void)sig;
	_exit(0);
}

static void on_child(int sig)
{
	int saved = errno;
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved;
}

int main(int argc, char **argv)
{
	struct sigaction sa;

	if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
		printf("csiops-pause %s\n", PAUSE_VERSION);
		return 0;
	}
	if (getpid() != 1)
		fprintf(stderr, "csiops-pause: warning: not PID 1, children of other processes are not reaped\n");

	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = on_term;
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0) {
		perror("csiops-pause: sigaction");
		return 1;
	}
	sa.sa_handler = on_child;
	sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
	if (sigaction(SIGCHLD, &sa, NULL) < 0) {
		perror("csiops-pause: sigaction");
		return 1;
	}

	for (;;)
		pause();
}
