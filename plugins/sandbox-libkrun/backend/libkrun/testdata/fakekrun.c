/*
 * A stand-in for libkrun in unit tests: it exports the krun_* functions the
 * back end binds, with libkrun.h's signatures, and writes one line per call
 * with every argument to the file given to fakekrun_setup. Build with
 * -DOMIT_<symbol> to leave a symbol out (an older or trimmed libkrun).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/eventfd.h>
#endif

static char log_path[4096];
static int32_t start_ret = -EINVAL;
static int efd_mode;
static int shutdown_fd = -1;
static int port_fd = -1, serial_fd = -1, net_fd = -1;
static uint8_t net_mac[6];

void fakekrun_setup(const char *path, int32_t ret, int eventfd_mode) {
	snprintf(log_path, sizeof log_path, "%s", path);
	start_ret = ret;
	efd_mode = eventfd_mode;
}

static FILE *out(void) {
	return fopen(log_path, "a");
}

static void put_str(FILE *f, const char *s) {
	if (s == NULL) {
		fputs("NULL", f);
		return;
	}
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20 || *p >= 0x7f)
			fprintf(f, "\\x%02x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

static void put_strv(FILE *f, const char *const *v) {
	if (v == NULL) {
		fputs("NULL", f);
		return;
	}
	fputc('[', f);
	for (int i = 0; v[i] != NULL && i < 256; i++) {
		if (i)
			fputc(' ', f);
		put_str(f, v[i]);
	}
	fputc(']', f);
}

/* What an fd is, in words that do not depend on its number. */
static void put_fd(FILE *f, int fd) {
	struct stat st;
	if (fd < 0) {
		fprintf(f, "%d", fd);
		return;
	}
	if (fstat(fd, &st) != 0) {
		fputs("bad-fd", f);
		return;
	}
	int fl = fcntl(fd, F_GETFD);
	const char *cloexec = (fl >= 0 && (fl & FD_CLOEXEC)) ? "+cloexec" : "";
	if (S_ISSOCK(st.st_mode))
		fprintf(f, "socket%s", cloexec);
	else if (S_ISREG(st.st_mode))
		fprintf(f, "file%s", cloexec);
	else
		fprintf(f, "other%s", cloexec);
}


#ifndef OMIT_krun_start_enter
static int io_all(int fd, uint8_t *b, size_t n, int writing) {
	while (n > 0) {
		ssize_t m = writing ? write(fd, b, n) : read(fd, b, n);
		if (m <= 0)
			return 0;
		b += m;
		n -= (size_t)m;
	}
	return 1;
}

/* Send an ARP request for the gateway over the NIC's socket, framed as
   libkrun frames it (a 32-bit big-endian length first), and log the
   answer: the socket reaches a network that speaks the framing. */
static void ask_gateway(void) {
	uint8_t fr[4 + 42] = {0};
	uint8_t *e = fr + 4, *a = e + 14;
	struct timeval tv = {10, 0};
	char answer[64] = "nothing";
	fr[3] = 42;
	memset(e, 0xff, 6);
	memcpy(e + 6, net_mac, 6);
	e[12] = 0x08, e[13] = 0x06;
	a[1] = 1, a[2] = 0x08, a[4] = 6, a[5] = 4, a[7] = 1;
	memcpy(a + 8, net_mac, 6);
	a[14] = 10, a[15] = 0, a[16] = 2, a[17] = 15;
	a[24] = 10, a[25] = 0, a[26] = 2, a[27] = 2;
	setsockopt(net_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	if (io_all(net_fd, fr, sizeof fr, 1)) {
		for (int i = 0; i < 8; i++) {
			uint8_t hdr[4], b[2048];
			uint32_t n;
			if (!io_all(net_fd, hdr, 4, 0))
				break;
			n = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
			if (n > sizeof b || !io_all(net_fd, b, n, 0))
				break;
			if (n >= 42 && b[12] == 0x08 && b[13] == 0x06 && b[21] == 2) {
				snprintf(answer, sizeof answer, "%u.%u.%u.%u is-at %02x:%02x:%02x:%02x:%02x:%02x",
					 b[28], b[29], b[30], b[31], b[22], b[23], b[24], b[25], b[26], b[27]);
				break;
			}
		}
	}
	FILE *f = out();
	fprintf(f, "network answered: %s\n", answer);
	fclose(f);
}
#endif

#define CTX 7

#ifndef OMIT_krun_create_ctx
int32_t krun_create_ctx(void) {
	FILE *f = out();
	fprintf(f, "krun_create_ctx() = %d\n", CTX);
	fclose(f);
	return CTX;
}
#endif

#ifndef OMIT_krun_free_ctx
int32_t krun_free_ctx(uint32_t ctx) {
	FILE *f = out();
	fprintf(f, "krun_free_ctx(%u)\n", ctx);
	fclose(f);
	return 0;
}
#endif

#ifndef OMIT_krun_set_log_level
int32_t krun_set_log_level(uint32_t level) {
	FILE *f = out();
	fprintf(f, "krun_set_log_level(%u)\n", level);
	fclose(f);
	return 0;
}
#endif

#ifndef OMIT_krun_init_log
int32_t krun_init_log(int fd, uint32_t level, uint32_t style, uint32_t options) {
	FILE *f = out();
	fprintf(f, "krun_init_log(%d, %u, %u, %u)\n", fd, level, style, options);
	fclose(f);
	return 0;
}
#endif

#ifndef OMIT_krun_set_vm_config
int32_t krun_set_vm_config(uint32_t ctx, uint8_t vcpus, uint32_t ram) {
	FILE *f = out();
	fprintf(f, "krun_set_vm_config(%u, %u, %u)\n", ctx, (unsigned)vcpus, ram);
	fclose(f);
	return ram == 4242 ? -ENOMEM : 0; /* a failing call for the error tests */
}
#endif

#ifndef OMIT_krun_set_kernel
int32_t krun_set_kernel(uint32_t ctx, const char *path, uint32_t format, const char *initramfs, const char *cmdline) {
	FILE *f = out();
	fprintf(f, "krun_set_kernel(%u, ", ctx);
	put_str(f, path);
	fprintf(f, ", %u, ", format);
	put_str(f, initramfs);
	fputs(", ", f);
	put_str(f, cmdline);
	fputs(")\n", f);
	fclose(f);
	return 0;
}
#endif

#ifndef OMIT_krun_set_env
int32_t krun_set_env(uint32_t ctx, const char *const envp[]) {
	FILE *f = out();
	fprintf(f, "krun_set_env(%u, ", ctx);
	put_strv(f, envp);
	fputs(")\n", f);
	fclose(f);
	return 0;
}
#endif

#ifndef OMIT_krun_disable_implicit_console
int32_t krun_disable_implicit_console(uint32_t ctx) {
	FILE *f = out();
	fprintf(f, "krun_disable_implicit_console(%u)\n", ctx);
	fclose(f);
	return 0;
}
#endif

#ifndef OMIT_krun_disable_implicit_vsock
int32_t krun_disable_implicit_vsock(uint32_t ctx) {
	FILE *f = out();
	fprintf(f, "krun_disable_implicit_vsock(%u)\n", ctx);
	fclose(f);
	return 0;
}
#endif

#ifndef OMIT_krun_add_virtio_console_multiport
int32_t krun_add_virtio_console_multiport(uint32_t ctx) {
	FILE *f = out();
	fprintf(f, "krun_add_virtio_console_multiport(%u) = 3\n", ctx);
	fclose(f);
	return 3;
}
#endif

#ifndef OMIT_krun_add_console_port_inout
int32_t krun_add_console_port_inout(uint32_t ctx, uint32_t console, const char *name, int in, int outfd) {
	FILE *f = out();
	fprintf(f, "krun_add_console_port_inout(%u, %u, ", ctx, console);
	put_str(f, name);
	fputs(", ", f);
	put_fd(f, in);
	fprintf(f, ", %s)\n", in == outfd ? "same" : "different");
	fclose(f);
	port_fd = in;
	return 0;
}
#endif

#ifndef OMIT_krun_add_serial_console_default
int32_t krun_add_serial_console_default(uint32_t ctx, int in, int outfd) {
	FILE *f = out();
	fprintf(f, "krun_add_serial_console_default(%u, ", ctx);
	put_fd(f, in);
	fputs(", ", f);
	put_fd(f, outfd);
	fputs(")\n", f);
	fclose(f);
	serial_fd = outfd;
	return 0;
}
#endif

#ifndef OMIT_krun_add_disk
int32_t krun_add_disk(uint32_t ctx, const char *id, const char *path, bool ro) {
	FILE *f = out();
	fprintf(f, "krun_add_disk(%u, ", ctx);
	put_str(f, id);
	fputs(", ", f);
	put_str(f, path);
	fprintf(f, ", %s)\n", ro ? "true" : "false");
	fclose(f);
	return 0;
}
#endif

#ifndef OMIT_krun_add_disk2
int32_t krun_add_disk2(uint32_t ctx, const char *id, const char *path, uint32_t format, bool ro) {
	FILE *f = out();
	fprintf(f, "krun_add_disk2(%u, ", ctx);
	put_str(f, id);
	fputs(", ", f);
	put_str(f, path);
	fprintf(f, ", %u, %s)\n", format, ro ? "true" : "false");
	fclose(f);
	return 0;
}
#endif

#ifndef OMIT_krun_add_net_unixstream
int32_t krun_add_net_unixstream(uint32_t ctx, const char *path, int fd, uint8_t *const mac, uint32_t features, uint32_t flags) {
	FILE *f = out();
	fprintf(f, "krun_add_net_unixstream(%u, ", ctx);
	put_str(f, path);
	fputs(", ", f);
	put_fd(f, fd);
	fprintf(f, ", %02x:%02x:%02x:%02x:%02x:%02x, %u, %u)\n", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5], features, flags);
	fclose(f);
	net_fd = fd;
	memcpy(net_mac, mac, 6);
	return 0;
}
#endif

#ifndef OMIT_krun_get_shutdown_eventfd
int32_t krun_get_shutdown_eventfd(uint32_t ctx) {
	FILE *f = out();
	fprintf(f, "krun_get_shutdown_eventfd(%u)\n", ctx);
	fclose(f);
#ifdef __linux__
	if (efd_mode) {
		shutdown_fd = eventfd(0, EFD_CLOEXEC);
		return shutdown_fd;
	}
#endif
	return -EINVAL;
}
#endif

#ifndef OMIT_krun_has_feature
int32_t krun_has_feature(uint64_t feature) {
	/* net and blk, like a BLK=1 NET=1 build; a 64-bit id with high bits
	   proves the argument is not truncated. */
	if (feature == 0 || feature == 1 || feature == ((uint64_t)1 << 40))
		return 1;
	return feature <= 11 ? 0 : -EINVAL;
}
#endif

#ifndef OMIT_krun_get_max_vcpus
int32_t krun_get_max_vcpus(void) { return 16; }
#endif

#ifndef OMIT_krun_check_nested_virt
int32_t krun_check_nested_virt(void) { return 0; }
#endif

#ifndef OMIT_krun_start_enter
int32_t krun_start_enter(uint32_t ctx) {
	FILE *f = out();
	fprintf(f, "krun_start_enter(%u)\n", ctx);
	fclose(f);
	/* Show the fds reach where they should: the agent's port and the
	   kernel console each get a line, the NIC an ARP request. */
	if (port_fd >= 0)
		(void)!write(port_fd, "hello from the guest port\n", 26);
	if (serial_fd >= 0)
		(void)!write(serial_fd, "kernel console line\n", 20);
	if (net_fd >= 0)
		ask_gateway();
	if (shutdown_fd >= 0) {
		uint64_t v;
		(void)!read(shutdown_fd, &v, sizeof v);
		f = out();
		fprintf(f, "shutdown requested (%llu)\n", (unsigned long long)v);
		fclose(f);
		return -EINTR;
	}
	return start_ret;
}
#endif
