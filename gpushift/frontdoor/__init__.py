"""The front door: one address for the people who use the models.

Its one job: take every client request for a model, forward it to whichever backend serves that
model now, hold it through a switch (no status line until the new backend is ready), and answer a
request it cannot forward with an OpenAI-format error that says when the model is served again.
It never starts a switch: what serves is the schedule's and people's decision, learnt from the
daemon.

* ``view`` (pure) -- :class:`DaemonView`, what the front door knows of the daemon;
* ``routing`` (pure) -- a request's model + what is known → forward / hold / answer;
* ``answers`` (pure) -- the error bodies and headers (Retry-After, the time in the schedule's zone);
* ``wire`` (pure) -- headers passed and dropped, routes forwarded, a body's model, the origins;
* ``state`` -- :class:`DoorState`: closed backends, held requests (``holding``), in-flight counts;
* ``core`` -- :class:`FrontDoor`, the object the daemon link drives (update, close, release, ...);
* ``proxy``, ``server`` -- the aiohttp side: one request, and the sockets; ``observe`` -- metrics
  and the access log;
* ``daemonlink``, ``listenfds``, ``main`` -- the D-Bus link, systemd's sockets and the command.
"""
