"""The terminal app: chat log, prompt, status bar, sessions (run with `localchat`).

``app.LocalChatApp`` is the Textual app: layout, bindings, mount, and the routing of messages
and actions to its parts, plain objects that each own one part of the app's state. The app
builds them and hands each the siblings it uses; a part asks the app itself only for what
``host.Host`` lists (notices, screens, workers, the log, the input, the status bar), and none
imports ``app.py``:

- ``app.models`` (``model_state.ModelState``): the loaded model, the one loading, why none is,
  its sampling and the ``/think`` choice;
- ``app.downloads`` (``download.ModelDownloads``): offering and pulling a model not on disk;
- ``app.turns`` (``turn.Turns``): the reply in flight, from send to saved, and stopping it,
  and when a queued message goes; ``app.turns.tools`` (``tool_events.ToolActivity``) shows
  its tool calls and puts the approval question (``approval.ApprovalScreen``) to the user;
- ``app.tool_servers`` (``tool_servers.ToolServers``): the tool servers started at open, their
  coming up or failing as notices, ``/tools``;
- ``app.queue`` (``typeahead.TypeAhead``): messages waiting for the engine;
- ``app.files`` (``attached_files.AttachedFiles``): the files going with the next message;
- ``app.draft`` (``draft.DraftHandOver``): when the draft being typed is handed over to be
  prefilled;
- ``app.composer`` (``composer.Composer``): what Enter does with the input, and its completions;
- ``app.message_actions`` (``message_actions.MessageActions``): copy, edit and versions of the
  messages on screen;
- ``app.sessions`` (``sessions.Sessions``): the open session, the sidebar, the chat services;
  ``session_view`` shows the open session (log, status bar numbers, sidebar, title);
- ``app.commands`` (``slash_commands.Commands``): the slash commands' handlers; each command is
  one record of ``slash_commands.COMMANDS`` (help, argument, handler, completions).

Widgets and screens (``chat_log``, ``user_message``, ``image_previews``, ``reply_view``,
``tool_calls``, ``stored_rounds``, ``prompt``, ``status``, ``sidebar``, ``screens``,
``approval``, ``thinking``, ``superseded_reply``) hold no app state; ``launch.run_app`` opens
the store, decides how pictures are previewed (``graphics_support``, which asks the terminal
before Textual reads it) and runs the app until it quits.
"""
