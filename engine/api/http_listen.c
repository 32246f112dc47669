/* SPDX-License-Identifier: MIT */
/*
 * engine/api/http_listen.c - the listening sockets of the HTTP server (http.c): TCP on a host
 * and port, or a Unix socket that replaces a stale socket file. Called once, at start.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "engine/api/http_int.h"

int dps_http_listen_tcp(const char *host, int port_no, int *lfd, int *bound, char *err,
			size_t errlen)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct addrinfo *ai, *a;
	char port[16];
	int rc, fd = -1, one = 1, saved = 0;

	snprintf(port, sizeof(port), "%d", port_no);
	rc = getaddrinfo(host, port, &hints, &ai);
	if (rc) {
		snprintf(err, errlen, "--host %s: %s", host, gai_strerror(rc));
		return -EINVAL;
	}
	for (a = ai; a; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
		if (fd < 0) {
			saved = errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (!bind(fd, a->ai_addr, a->ai_addrlen) && !listen(fd, 1024))
			break;
		saved = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd < 0) {
		snprintf(err, errlen, "cannot listen on %s:%d: %s", host, port_no,
			 strerror(saved ? saved : EADDRNOTAVAIL));
		return -(saved ? saved : EADDRNOTAVAIL);
	}
	{
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);

		if (!getsockname(fd, (struct sockaddr *)&ss, &sl))
			*bound = ss.ss_family == AF_INET6
					  ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
					  : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	}
	*lfd = fd;
	return 0;
}

int dps_http_listen_unix(const char *path, int *lfd, char *bound, size_t bound_len, char *err,
			 size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "--unix-socket %s: the path is too long (at most %zu bytes)",
			 path, sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -errno;
	}
	/* A socket file left by an earlier run is replaced, unless something still answers. */
	if (!lstat(sa.sun_path, &st) && S_ISSOCK(st.st_mode)) {
		int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			close(probe);
			close(fd);
			snprintf(err, errlen, "--unix-socket %s: another server is listening there",
				 sa.sun_path);
			return -EADDRINUSE;
		}
		if (probe >= 0)
			close(probe);
		unlink(sa.sun_path);
	}
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 1024)) {
		const int e = errno;

		snprintf(err, errlen, "cannot listen on %s: %s", sa.sun_path, strerror(e));
		close(fd);
		return -e;
	}
	snprintf(bound, bound_len, "%s", sa.sun_path);
	*lfd = fd;
	return 0;
}
