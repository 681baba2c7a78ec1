/* sandbox-launch: the first hop of a sandbox's launch, and the sandbox's pid 1 (sandboxes/bwrap.py).
 *
 *   sandbox-launch [--join FILE]... [--rlimit RESOURCE VALUE]... [--ids UID GID] -- PROGRAM ARG...
 *   sandbox-launch --init -- COMMAND ARG...          (inside the sandbox, as its pid 1)
 *   sandbox-launch --init-wait FD                    (the same, with the command read from FD)
 *
 * In this order: writes "0" (itself) into each cgroup join FILE, sets each limit (soft = hard),
 * drops to UID/GID with no supplementary groups, checks the drop cannot be undone, and execs
 * PROGRAM (an absolute path: no PATH search, and the environment passes through untouched).
 * Any step that fails stops the launch before PROGRAM starts: a message on stderr, exit 125.
 *
 * It replaces `/bin/sh -c 'echo 0 >tasks; ulimit ...; exec "$@"'` followed by setpriv: the
 * same steps in the same order, in one small statically linked exec instead of two
 * dynamically linked ones (each loads libc and, for setpriv, libcap-ng and its locale).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static void fail(const char *what, const char *arg) {
    fprintf(stderr, "sandbox-launch: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    _exit(125);
}

static unsigned long long number(const char *text) {
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno || !end || *end || !*text || text[0] == '-') {
        errno = EINVAL;
        fail("not a number:", text);
    }
    return value;
}

/* The sandbox's pid 1, as `sh -c "trap '' INT QUIT; (\"$@\")"` was (and as the supervisor
 * starts a command, sandboxes/inside.py): SIGINT and SIGQUIT ignored, for the command too; the
 * command in a child (never pid 1 itself); every orphan reaped while it runs; the shell's note
 * when it dies of a signal ("Terminated", "Segmentation fault (core dumped)"; not for SIGINT or
 * SIGPIPE) and its status (128 + signal); a command that cannot start gets the shell's message
 * and status (127 not found, 126 otherwise). When this exits, the kernel kills the rest of the
 * pid namespace. One static exec instead of the shell's dynamically linked one. */
static int init(char **command, char **env, const char *cwd, int stdin_fd) {
    signal(SIGINT, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    pid_t child = fork();
    if (child < 0) {
        perror("sandbox-init: fork");
        return 2;
    }
    if (child > 0 && stdin_fd >= 0)
        close(stdin_fd); /* the command's alone */
    if (child == 0) {
        if (env)
            environ = env; /* before execvp: its PATH search reads this environment */
        if (cwd && chdir(cwd) != 0) {
            fprintf(stderr, "sandbox-init: cannot change directory to %s: %s\n", cwd,
                    strerror(errno));
            _exit(125);
        }
        if (stdin_fd >= 0 && dup2(stdin_fd, 0) != 0) {
            perror("sandbox-init: stdin");
            _exit(125);
        }
        /* execvp: PATH search, EACCES remembered while later directories are tried, and a
         * file without #! run by /bin/sh, as the shell does. */
        execvp(command[0], command);
        int e = errno;
        int missing = e == ENOENT || e == ENOTDIR;
        fprintf(stderr, "sandbox-init: 1: %s: %s\n", command[0],
                missing ? "not found" : strerror(e));
        _exit(missing || e == ELOOP || e == ENAMETOOLONG ? 127 : 126);
    }
    for (;;) {
        int status;
        pid_t done = wait(&status);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return 2;
        }
        if (done != child)
            continue; /* an orphan, reaped */
        if (WIFEXITED(status))
            return WEXITSTATUS(status);
        int sig = WTERMSIG(status);
        if (sig != SIGINT && sig != SIGPIPE) {
            const char *name = strsignal(sig);
            fprintf(stderr, "%s%s\n", name ? name : "Unknown signal",
                    WCOREDUMP(status) ? " (core dumped)" : "");
        }
        return 128 + sig;
    }
}

/* A sandbox started ahead of its first command (sandboxes/bwrap.py, ``Prestarted``): pid 1
 * waits on the unix stream socket FD for the command, then runs it as init() does. The
 * message: an 8-byte length (native order), carrying the command's stdin as an SCM_RIGHTS
 * descriptor when it has one (else the command keeps this process's stdin, /dev/null), then
 * that many bytes of NUL-terminated fields: the working directory, the number of environment
 * entries, the entries, the argv. A length, not EOF, ends the message: a copy of the host's
 * end in a process the host forked must not keep the command waiting. EOF before a message
 * (the host gave the sandbox up) ends this process. Nothing but it runs in the sandbox until
 * then; FD is closed before the command starts. */
static int read_fully(int fd, char *buffer, size_t size) {
    size_t done = 0;
    while (done < size) {
        ssize_t got = read(fd, buffer + done, size - done);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        done += (size_t)got;
    }
    return 0;
}

static int malformed(void) {
    fprintf(stderr, "sandbox-init: malformed command\n");
    return 125;
}

static int init_wait(const char *fd_text) {
    int sock = (int)number(fd_text);
    unsigned long long length = 0;
    char control[CMSG_SPACE(sizeof(int))];
    struct iovec header = {&length, sizeof(length)};
    struct msghdr hello = {0};
    hello.msg_iov = &header;
    hello.msg_iovlen = 1;
    hello.msg_control = control;
    hello.msg_controllen = sizeof(control);
    ssize_t got;
    do
        got = recvmsg(sock, &hello, MSG_CMSG_CLOEXEC);
    while (got < 0 && errno == EINTR);
    if (got == 0)
        return 0; /* given up: no command */
    if (got < 0) {
        perror("sandbox-init: recvmsg");
        return 125;
    }
    int stdin_fd = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&hello); c; c = CMSG_NXTHDR(&hello, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
            c->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&stdin_fd, CMSG_DATA(c), sizeof(int));
    if ((size_t)got < sizeof(length) &&
        read_fully(sock, (char *)&length + got, sizeof(length) - (size_t)got) != 0)
        return malformed();
    if (length == 0 || length > (1ULL << 30))
        return malformed();
    char *message = malloc(length);
    if (!message || read_fully(sock, message, length) != 0 || message[length - 1] != '\0')
        return malformed();
    close(sock);
    size_t fields = 0;
    for (size_t k = 0; k < length; k++)
        fields += message[k] == '\0';
    char **field = calloc(fields + 1, sizeof(char *));
    if (!field || fields < 3)
        return malformed();
    for (size_t k = 0, start = 0; k < fields; k++) {
        field[k] = message + start;
        start += strlen(field[k]) + 1;
    }
    unsigned long long count = number(field[1]);
    if (count + 3 > fields)
        return malformed();
    char **env = calloc(count + 1, sizeof(char *));
    if (!env) {
        perror("sandbox-init: environment");
        return 125;
    }
    for (size_t k = 0; k < count; k++)
        env[k] = field[2 + k];
    return init(field + 2 + count, env, field[0], stdin_fd);
}

int main(int argc, char **argv) {
    if (argc > 3 && strcmp(argv[1], "--init") == 0 && strcmp(argv[2], "--") == 0)
        return init(argv + 3, NULL, NULL, -1);
    if (argc == 3 && strcmp(argv[1], "--init-wait") == 0)
        return init_wait(argv[2]);
    int i = 1;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (strcmp(argv[i], "--join") == 0 && i + 1 < argc) {
            const char *path = argv[++i];
            int fd = open(path, O_WRONLY | O_CLOEXEC);
            if (fd < 0 || write(fd, "0", 1) != 1)
                fail("cannot join cgroup", path);
            close(fd);
        } else if (strcmp(argv[i], "--rlimit") == 0 && i + 2 < argc) {
            int resource = (int)number(argv[i + 1]);
            struct rlimit limit;
            limit.rlim_cur = limit.rlim_max = (rlim_t)number(argv[i + 2]);
            if (setrlimit(resource, &limit) != 0)
                fail("cannot set rlimit", argv[i + 1]);
            i += 2;
        } else if (strcmp(argv[i], "--ids") == 0 && i + 2 < argc) {
            uid_t uid = (uid_t)number(argv[i + 1]);
            gid_t gid = (gid_t)number(argv[i + 2]);
            i += 2;
            if (setgroups(0, NULL) != 0)
                fail("cannot clear groups", NULL);
            if (setresgid(gid, gid, gid) != 0)
                fail("cannot set gid", argv[i]);
            if (setresuid(uid, uid, uid) != 0)
                fail("cannot set uid", argv[i - 1]);
            /* As setpriv does: the drop must be final (no saved id, no way back to root). */
            uid_t r, e, s;
            gid_t rg, eg, sg;
            if (getresuid(&r, &e, &s) != 0 || r != uid || e != uid || s != uid ||
                getresgid(&rg, &eg, &sg) != 0 || rg != gid || eg != gid || sg != gid ||
                getgroups(0, NULL) != 0) {
                errno = EPERM;
                fail("ids not dropped", NULL);
            }
            if (uid != 0 && (setresuid(0, 0, 0) == 0 || setresgid(0, 0, 0) == 0)) {
                errno = EPERM;
                fail("could regain root after the drop", NULL);
            }
        } else {
            errno = EINVAL;
            fail("bad argument", argv[i]);
        }
    }
    if (i >= argc || argv[i][0] != '/') {
        errno = EINVAL;
        fail("no absolute program to run", i < argc ? argv[i] : NULL);
    }
    execv(argv[i], argv + i);
    fail("cannot exec", argv[i]);
    return 125;
}
