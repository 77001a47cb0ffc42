-- Whether a replay records the browser's sound (`record_audio`), so that the segment
-- started after a viewport change does too. NULL (older replays): no sound.
ALTER TABLE replays ADD COLUMN record_audio BOOLEAN;
